"""Training-side building blocks: tree packing, checkpoints, logging, optimizers."""
