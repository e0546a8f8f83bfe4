"""Retrieval quality measures production uses too: the eval-set model, ranking and abstention
metrics, paired significance tests. The reindex parity gate and the calibration of the evidence
score build on them; the evaluation harness and its data live in the dev tools (`ragdev.eval`)."""
