"""What `kt-train` prints when training ends: what happened and the commands to run next.

`summarize` prints nothing: the text is the "report" of its result, which the command prints
on stdout as its output (whatever --log-level says)."""

from __future__ import annotations

from keras_transformer.run_dir import Run
from keras_transformer.settings.args import TrainSettings


def summarize(run_dir: Run, settings: TrainSettings, model, bleu) -> dict:
    """What happened and what to do next, as a dict; its "report" is the text to show."""
    progress = bleu.progress
    best, best_step = float(progress.best.numpy()), int(progress.best_step.numpy())
    result = {
        "step": int(model.optimizer.iterations.numpy()),
        "train_steps": settings.train_steps,
        "stopped_early": bleu.stopped_early,
        "last_val_bleu": bleu.last_bleu,
        "best_val_bleu": best if best_step >= 0 else None,
        "best_step": best_step if best_step >= 0 else None,
        "best_checkpoint": (run_dir.checkpoints(best=True) or [None])[-1],
    }
    out = run_dir.model_dir
    lines = [
        f"\ntraining ended at step {result['step']} of {settings.train_steps}"
        + (" (early stopping)" if bleu.stopped_early else ""),
    ]
    if result["best_val_bleu"] is not None:
        last = f"last {bleu.last_bleu:.2f}, " if bleu.last_bleu is not None else ""
        lines.append(
            f"validation BLEU: {last}best {best:.2f} at step {best_step} "
            f"({result['best_checkpoint']})"
        )
    src, ref = _test_files(settings)
    lines += [
        "next steps:",
        f"  kt-export --model-dir {out} --export-dir exports   # averages the last 5 checkpoints",
        f"  kt-export --model-dir {out} --export-dir exports --best   # or the best-BLEU weights",
        f"  kt-translate --model exports/transformer/1 < {src} > translations.txt",
        f"  kt-evaluate --model exports/transformer/1 --src {src} --ref {ref}",
        "  (exports/transformer/1: the version directory that kt-export prints)",
    ]
    result["report"] = "\n".join(lines)
    return result


def _test_files(settings: TrainSettings) -> tuple[str, str]:
    if settings.dataset == "multi30k":
        from keras_transformer.data.sources import DataError, find_multi30k_file

        try:
            return tuple(
                find_multi30k_file("test", lang, settings.data_dir, download=False)
                for lang in (settings.src_lang, settings.tgt_lang)
            )
        except DataError:  # only a hint in the summary
            pass
    return f"test.{settings.src_lang}", f"test.{settings.tgt_lang}"
