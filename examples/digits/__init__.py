"""Hand-written digits classified by a small MLP: the example function trial."""
