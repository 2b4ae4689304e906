"""Command templates: a trial's command line with ``{name}`` placeholders, turned into an argv.

The template is split into words first (``shlex``, POSIX rules; no shell ever runs), and only then
is each placeholder replaced inside its word. A value therefore stays exactly one argument, or one
piece of one, whatever it holds: spaces, quotes or ``--evil=1`` never become words of their own.

Placeholders are bare parameter names, ``{lr}``; ``{{`` and ``}}`` are literal braces. Python's
format mini-language is refused: a format spec can hang (``{x:>99999999}`` pads to 100 MB) and
attribute or index access reaches into objects (``{x.__class__}``), and neither is needed to put a
value into a command line. Quotes only group words: a placeholder inside quotes is replaced too.

``{trial_dir}`` is the trial's own folder (the one ``HERMES_TRIAL_DIR`` names), for a program that writes its files
by relative path into its working directory, which all trials share: it is known only where the trial is launched,
so the argv holds TRIAL_DIR_MARK in its place until ``with_trial_dir`` fills it in. A parameter of the search space
named ``trial_dir`` fills it instead, as any parameter fills its placeholder.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hermes.errors import HermesError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFUSED = {  # the first of these characters in a placeholder says what it tried to do
    ":": "format specs are",
    "!": "conversions are",
    ".": "attribute access is",
    "[": "index access is",
}


TRIAL_DIR = "trial_dir"  # the placeholder of the trial's own folder
# what stands for it in an argv until the trial is launched: no argument holds a NUL (a template or value with one is
# refused), so the mark is never text of the command's own
TRIAL_DIR_MARK = "\0trial_dir\0"


class CommandError(HermesError):
    """A command template cannot be parsed, or cannot be filled with a trial's parameters."""


@dataclass(frozen=True, slots=True)
class Placeholder:
    name: str


Word = tuple[str | Placeholder, ...]  # literal text and placeholders, in order


@dataclass(frozen=True, slots=True)
class CommandTemplate:
    """A parsed template: its words, each a sequence of literal text and placeholders."""

    text: str
    words: tuple[Word, ...]

    @property
    def placeholders(self) -> tuple[str, ...]:
        """The parameter names used, in order of first use."""
        names = (part.name for word in self.words for part in word if isinstance(part, Placeholder))
        return tuple(dict.fromkeys(names))

    def argv(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        """One argument per word of the template, each placeholder replaced by ``str(value)``."""
        argv = []
        for word in self.words:
            pieces = []
            for part in word:
                if isinstance(part, str):
                    pieces.append(part)
                    continue
                if part.name not in params and part.name == TRIAL_DIR:  # filled where the trial is launched
                    pieces.append(TRIAL_DIR_MARK)
                    continue
                if part.name not in params:
                    known = ", ".join(params) or "none"
                    raise CommandError(f"{self.text!r}: placeholder {{{part.name}}} has no value (parameters: {known})")
                value = str(params[part.name])
                if "\0" in value:
                    raise CommandError(f"{self.text!r}: the value of {{{part.name}}} holds a NUL character, "
                                       "which no command-line argument can carry")
                pieces.append(value)
            argv.append("".join(pieces))
        return tuple(argv)


@lru_cache(maxsize=64)
def parse_template(template: str) -> CommandTemplate:
    """Split ``template`` into words, then find the placeholders of each; CommandError says what is wrong."""
    try:
        words = shlex.split(template)
    except ValueError as error:  # unbalanced quotes, a trailing backslash
        raise CommandError(f"cannot parse {template!r}: {str(error).lower()}") from None
    if not words:
        raise CommandError("must not be empty")
    if "\0" in template:
        raise CommandError("holds a NUL character, which no command-line argument can carry")
    return CommandTemplate(template, tuple(_parts(word) for word in words))


def validate_template(template: str, names: Collection[str]) -> CommandTemplate:
    """Parse ``template`` and check that every placeholder is one of ``names`` (the search space), or {trial_dir}."""
    parsed = parse_template(template)
    for name in parsed.placeholders:
        if name not in names and name != TRIAL_DIR:
            raise CommandError(f"placeholder {{{name}}} is not in search.space (parameters: {', '.join(names)}), "
                               f"nor {{{TRIAL_DIR}}}, the trial's own folder")
    return parsed


def command_argv(template: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    """The argv of a trial: ``template`` split into words, its placeholders filled from ``params``."""
    return parse_template(template).argv(params)


def with_trial_dir(argv: Sequence[str], directory: str) -> list[str]:
    """``argv`` with the trial's folder, ``directory``, where ``{trial_dir}`` was."""
    return [argument.replace(TRIAL_DIR_MARK, directory) for argument in argv]


def _parts(word: str) -> Word:
    parts: list[str | Placeholder] = []
    literal: list[str] = []
    index = 0
    while index < len(word):
        char = word[index]
        if char in "{}" and word.startswith(char * 2, index):  # {{ or }}: a literal brace
            literal.append(char)
            index += 2
        elif char == "}":
            raise CommandError(f"single '}}' in {word!r}; write }}}} for a literal brace")
        elif char == "{":
            end = word.find("}", index)
            if end < 0:
                raise CommandError(f"unclosed placeholder in {word!r} (a placeholder never spans words); "
                                   "write {{ for a literal brace")
            field = word[index + 1 : end]
            _check_field(field)
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(Placeholder(field))
            index = end + 1
        else:
            literal.append(char)
            index += 1
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def _check_field(field: str) -> None:
    if _NAME.fullmatch(field):
        return
    refused = [(field.find(char), what) for char, what in _REFUSED.items() if char in field]
    if refused and _NAME.fullmatch(field[: min(refused)[0]]):
        what = min(refused)[1]
        raise CommandError(f"{{{field}}}: {what} not allowed; a placeholder is a bare parameter name like "
                           f"{{{field[: min(refused)[0]]}}} (format the value in the program)")
    raise CommandError(f"{{{field}}}: placeholders must name a parameter, like {{lr}}; "
                       "write {{ and }} for literal braces")
