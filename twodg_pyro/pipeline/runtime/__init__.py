"""The run around the methods (the top layer of the pipeline): :func:`~.runner.run`,
the context the methods share, where the stages run (one process or every rank),
checkpoints, the run folder, and the variants of the 2DG stages on one stage 1."""
