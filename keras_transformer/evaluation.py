"""sacreBLEU scoring (detokenized, cased) of translations against references."""

from __future__ import annotations

import sacrebleu


def score(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU and chrF with their signatures, as a JSON-ready dict."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }
