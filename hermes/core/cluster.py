"""The cluster model: nodes, their GPUs, who occupies each GPU and which trials each node owns.

It may change during a run (nodes and GPUs come and go). It holds state only; the global and
node schedulers hold the logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hermes.core.trial import Trial
from hermes.errors import HermesError


@dataclass(slots=True, eq=False)
class Node:
    name: str
    occupant: dict[str, Trial | None] = field(default_factory=dict)  # GPU -> trial holding it
    members: dict[str, Trial] = field(default_factory=dict)  # unfinished trials placed on this node

    @property
    def load(self) -> float:
        """Trials time-sharing each GPU; a node without GPUs is infinitely loaded."""
        return len(self.members) / len(self.occupant) if self.occupant else float("inf")

    def free_gpus(self) -> list[str]:
        return [gpu for gpu, trial in self.occupant.items() if trial is None]


class Cluster:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.gpu_node: dict[str, Node] = {}

    def add_node(self, name: str, gpus: tuple[str, ...] = ()) -> Node:
        if name in self.nodes:
            raise HermesError(f"node {name} is already in the cluster")
        node = self.nodes[name] = Node(name)
        for gpu in gpus:
            self.add_gpu(name, gpu)
        return node

    def remove_node(self, name: str) -> Node:
        node = self._node(name)
        for gpu in node.occupant:
            del self.gpu_node[gpu]
        return self.nodes.pop(name)

    def add_gpu(self, node_name: str, gpu: str) -> None:
        if gpu in self.gpu_node:
            raise HermesError(f"GPU {gpu} is already in the cluster")
        node = self._node(node_name)
        node.occupant[gpu] = None
        self.gpu_node[gpu] = node

    def remove_gpu(self, gpu: str) -> tuple[Node, Trial | None]:
        """Forget ``gpu``; return its node and the trial that was running on it, if any."""
        node = self.node_of(gpu)
        del self.gpu_node[gpu]
        return node, node.occupant.pop(gpu)

    def node_of(self, gpu: str) -> Node:
        try:
            return self.gpu_node[gpu]
        except KeyError:
            raise HermesError(f"unknown GPU {gpu}") from None

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_node)

    def _node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise HermesError(f"unknown node {name}") from None
