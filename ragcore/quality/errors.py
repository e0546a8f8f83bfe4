"""Errors of the evaluation harness (subclasses of the one ragstream root)."""

from __future__ import annotations

from ragcore.errors import RagstreamError


class EvalError(RagstreamError):
    """The evaluation could not be computed as asked (e.g. a run misses queries of the set)."""

    code = "EVAL_ERROR"


class EvalDataError(EvalError):
    """An evaluation file (eval set, BEIR file, pin, gate) is malformed; the message says where."""

    code = "EVAL_DATA_ERROR"
