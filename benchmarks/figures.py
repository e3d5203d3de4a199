"""The measured figures have one source, docs/figures/measured.json (one record per
measurement: value, unit, command, date, commit, machine and the version it belongs to), and
the figures of README.md and docs/*.md between `<!-- figures:NAME -->` and `<!-- /figures -->`
are generated from it (and from the automatic recipe, for what `kt-train` resolves).

    python benchmarks/figures.py          # rewrite the pages' figures from the data
    python benchmarks/figures.py --check  # exit 1 naming each page that disagrees

A benchmark run with `--record FILE` appends its JSON result to FILE (`record`) with the
command, date, commit and CPU; a figure the docs quote is then a record of measured.json.
No TensorFlow here: the recipe is `keras_transformer.settings`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs", "figures", "measured.json")
PAGES = ("README.md", "docs/results.md", "docs/benchmarks.md", "docs/inference.md",
         "docs/training.md", "docs/quickstart.md")  # fmt: skip
BLOCK = re.compile(r"(<!-- figures:([\w-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)


class Figures:
    """The records by id, and their formatting."""

    def __init__(self, data: dict):
        self.machines = data["machines"]  # id -> {"name", "description"}
        self.records = {r["id"]: r for r in data["records"]}

    def __getitem__(self, key: str) -> dict:
        return self.records[key]

    def num(self, key: str, digits: int = 0, field: str = "value") -> str:
        value = self.records[key][field]
        if isinstance(value, list):
            return "-".join(_num(v, digits) for v in value)
        return _num(value, digits)

    def ratio(self, key: str, rng: bool = True) -> str:
        text = f"{self.num(key, 2)}x"
        if rng and "range" in self[key]:
            text += f" ({self.num(key, 2, 'range')})"
        return text

    def when(self, key: str) -> str:
        return f"{self[key]['date']}, {self.machine(self[key]['machine'])}"

    def machine(self, key: str) -> str:
        return self.machines[key]["name"]


def _num(value, digits: int) -> str:
    return f"{value:,.{digits}f}"


def para(*texts: str) -> str:
    """Paragraphs wrapped at 100 columns, as the pages are written."""
    wrap = dict(width=100, break_long_words=False, break_on_hyphens=False)
    return "\n\n".join(textwrap.fill(text, **wrap) for text in texts) + "\n"


def default_recipe(figures: Figures):
    """What `kt-train` resolves on Multi30k today, from the measured batches per pass (on a
    machine without a GPU: its micro-batch bound is given, so TensorFlow is not asked)."""
    from keras_transformer.settings.args import MICRO_BATCH_MEMORY_GIB, TrainArgs
    from keras_transformer.settings.recipe import resolve

    spe = figures["multi30k-batches-per-pass"]["value"]
    args = TrainArgs(micro_batch_memory=MICRO_BATCH_MEMORY_GIB)
    return resolve(args, num_pairs=29_000, batches_per_pass=lambda *a, **k: spe)


# -- the blocks: NAME -> the Markdown between its markers ------------------------------------


def readme_expect(f: Figures) -> str:
    r = default_recipe(f)
    return para(
        "What to expect: the training command resolves the small-corpus recipe from the corpus "
        f"size and prints it (8000-piece BPE, {r.batch_tokens}-token batches, 20 passes = "
        f"{r.train_steps:,} updates, warmup {r.warmup_steps:,}, validation BLEU every "
        f"{r.eval_every:,} updates and at each epoch end, dropout {r.dropout_rate}), writes "
        "everything to `runs/multi30k-en-de/`, and resumes where it stopped when run again. "
        f"Measured with 0.1.0's data order ({f['default-recipe-train-time']['last_step']:,} "
        f"updates) on 2 CPU cores ({f.machine('epyc')}, nothing else running), it took **"
        f"{f.num('default-recipe-train-time')} minutes** and the default export scored **"
        f"{f.num('quality-en-de-bleu', 2)} BLEU** (chrF {f.num('quality-en-de-bleu', 2, 'chrf')}"
        ") on test_2016_flickr en->de (sacreBLEU, cased, detokenized; "
        "[docs/results.md](docs/results.md) has the runs and commands)."
    )


def quality(f: Figures, weights: bool = False) -> str:
    head = "| direction | test BLEU | chrF | trained |\n| --- | ---: | ---: | --- |\n"
    rows = [("en -> de", "quality-en-de-bleu"), ("de -> en", "quality-de-en-bleu")]
    if weights:
        rows.insert(1, ("en -> de", "quality-en-de-timed-bleu"))
    out = head
    for direction, key in rows:
        r = f[key]
        bold = "**" if key != "quality-en-de-timed-bleu" else ""
        trained = f"{f.when(key)}, commit {r['commit']}, 0.1.0's data order"
        if weights and "note" in r:
            trained += f"; {r['note']}"
        bleu, chrf = f.num(key, 2), f.num(key, 2, "chrf")
        out += f"| {direction} | {bold}{bleu}{bold} | {chrf} | {trained} |\n"
    return out


def speed_summary(f: Figures) -> str:
    rows = [
        ("training step, small preset (W1)",
         f"{f.num('w1-ours')} target tokens/s, {f.num('w1-ours', 2, 'ratio')}x a stock-Keras "
         "Transformer", "w1-ours"),
        ("training step, base preset (W2)",
         f"{f.num('w2-ours')} target tokens/s, {f.num('w2-ours', 2, 'ratio')}x a stock-Keras "
         "Transformer", "w2-ours"),
        ("decoding test_2016 with the default recipe's run, default export vs CTranslate2 "
         "float32", f"{f.ratio('real-default-beam4', False)} at beam 4, "
         f"{f.ratio('real-default-greedy', False)} greedy", "real-default-beam4"),
        ("the same, `kt-export --xla` (the default export's outputs) vs CTranslate2 float32",
         f"{f.num('real-xla-5-beam4', 2)}-{f.num('real-xla-3-beam4', 2)}x at beam 4, "
         f"{f.num('real-xla-5-greedy', 2)}-{f.num('real-xla-3-greedy', 2)}x greedy (two runs)",
         "real-xla-3-beam4"),
        ("WMT-sized resume (4.5M pairs, `benchmarks/bench_wmt_rehearsal.py`): mid-pass vs "
         "fresh start, to the first update",
         f"{f.num('wmt-resume-ratio', 2)}x ({f.num('wmt-resume-ratio', 1, 'resume_s')} s vs "
         f"{f.num('wmt-resume-ratio', 1, 'fresh_s')} s)", "wmt-resume-ratio"),
    ]  # fmt: skip
    out = "| workload | figure | measured |\n| --- | --- | --- |\n"
    return out + "".join(f"| {w} | {v} | {f.when(k)} |\n" for w, v, k in rows)


def training_speed(f: Figures) -> str:
    out = "| workload | stock Keras | keras-transformer | measured |\n| --- | ---: | ---: | --- |\n"
    for name, w in (("W1: small, vocabulary 8000, batch 64 x 24 x 24", "w1"),
                    ("W2: base, vocabulary 32000, batch 32 x 32 x 32", "w2")):  # fmt: skip
        ours = f"{f.num(w + '-ours')} ({f.num(w + '-ours', 2, 'ratio')}x)"
        out += f"| {name} | {f.num(w + '-stock')} | **{ours}** | {f.when(w + '-ours')} |\n"
    return out


def training_detail(f: Figures) -> str:
    out = (
        "| workload | implementation | target tokens/s | model GFLOP/s | peak RSS |\n"
        "| --- | --- | ---: | ---: | ---: |\n"
    )
    for name, w in (("W1 small, vocab 8000, 64 x 24 x 24", "w1"),
                    ("W2 base, vocab 32000, 32 x 32 x 32", "w2")):  # fmt: skip
        s, o = f[w + "-stock"], f[w + "-ours"]
        out += (
            f"| {name} | stock Keras baseline | {f.num(w + '-stock')} | {s['gflops']} | "
            f"{s['peak_rss_gb']} GB |\n| | **keras-transformer** | **{f.num(w + '-ours')} "
            f"({o['ratio']:.2f}x)** | {o['gflops']} | {o['peak_rss_gb']} GB |\n"
        )
    return out


REAL_ROWS = (
    ("default", "default (any TF Serving)", "`--rounds 2`"),
    ("xla-3", "`kt-export --xla` (TF Serving with XLA enabled)", "`--rounds 3 --xla --baseline .`"),
    ("xla-5", "`kt-export --xla`, again", "`--rounds 5 --xla --baseline .`"),
    ("bfloat16", "`kt-export --dtype bfloat16` (emulated on this CPU)",
     "`--rounds 3 --dtype bfloat16`"),
)  # fmt: skip


def real_decoding(f: Figures) -> str:
    out = (
        "| export | bench_real.py flags | beam 4, alpha 0.6, +50 | greedy |\n"
        "| --- | --- | ---: | ---: |\n"
    )
    for key, name, flags in REAL_ROWS:
        cells = []
        for mode in ("beam4", "greedy"):
            k = f"real-{key}-{mode}"
            cells.append(f"**{f.ratio(k)}**, {f.num(k, 1, 'sentences_per_s')} sentences/s")
        out += f"| {name} | {flags} | {cells[0]} | {cells[1]} |\n"
    return (
        out
        + "\n"
        + para(
            f"Measured {f['real-default-beam4']['date']} on the {f.machine('xeon')} machine, each command "
            "alone under the benchmark lock; a ratio is the median of the per-round ratios to "
            "CTranslate2 4.8.5 float32, with their range."
        )
    )


def decoding_summary(f: Figures) -> str:
    return para(
        "On the default recipe's converged run, the default export decodes real sentences "
        f"(test_2016_flickr) at {f.ratio('real-default-beam4', False)} the speed of CTranslate2 "
        f"float32 with the same weights at beam 4 and {f.ratio('real-default-greedy', False)} "
        f"greedy; the `--xla` export at {f.num('real-xla-5-beam4', 2)}-"
        f"{f.num('real-xla-3-beam4', 2)}x and {f.num('real-xla-5-greedy', 2)}-"
        f"{f.num('real-xla-3-greedy', 2)}x ({f.when('real-default-beam4')}). An early run of "
        f"400 updates, which loops to the maximum length more often, was at "
        f"{f.ratio('real-small400-beam4', False)} and {f.ratio('real-small400-greedy', False)} "
        f"({f.when('real-small400-beam4')}): see [results](results.md#speed) and "
        "[benchmarks](benchmarks.md). Evaluating test_2016_flickr (1,000 sentences) through an "
        f"export of a small-preset run took {f.num('eval-seconds', 1)} s on 2 CPU cores "
        "([2026-11-23](experiments/2026-11-23-evaluation-speed.md))."
    )


def xla_training(f: Figures) -> str:
    return para(
        f"W1 on 2 CPU cores: {f.num('w1-no-xla-shared')} target tokens/s without XLA, "
        f"{f.num('w1-xla-shared')} with (`{f['w1-no-xla-shared']['command']}`, with and without "
        f"`--jit-compile`, {f['w1-xla-shared']['date']}, on a machine shared with other jobs: "
        f"compare with each other, not with the {f.num('w1-ours')} of an exclusive run in "
        "[results](results.md#training))."
    )


def quickstart_recipe(f: Figures) -> str:
    r = default_recipe(f)
    t = f["default-recipe-train-time"]
    return para(
        "At the start it prints the settings it resolved from the size of the corpus, each "
        f"marked `(auto)`: an 8000-piece joint BPE vocabulary (trained first), "
        f"{r.batch_tokens}-token batches, {r.steps_per_epoch} updates per pass x 20 passes = "
        f"{r.train_steps:,} updates, warmup {r.warmup_steps:,}, dropout {r.dropout_rate}, "
        f"validation BLEU on {r.eval_sentences} sentences every {r.eval_every} updates and at "
        "each epoch end. Progress shows as Keras's progress bar.",
        f"With 0.1.0's data order ({t['last_step']:,} updates), on 2 CPU cores "
        f"({f.machine(t['machine'])}, nothing else running, {t['date']}) this took **"
        f"{f.num('default-recipe-train-time')} minutes**.",
    )


def quickstart_quality(f: Figures) -> str:
    return para(
        f"Our run of the default recipe (0.1.0's data order, {f.when('quality-en-de-bleu')}) "
        f"scored **{f.num('quality-en-de-bleu', 2)} BLEU, chrF "
        f"{f.num('quality-en-de-bleu', 2, 'chrf')}** on test_2016_flickr (1,000 sentences) "
        f"en->de, and {f.num('quality-de-en-bleu', 2)} / {f.num('quality-de-en-bleu', 2, 'chrf')}"
        " de->en ([results](results.md)); evaluating took about 10 s on 2 CPU cores."
    )


def machines(f: Figures) -> str:
    return "".join(f"- {m['name']}: {m['description']}\n" for m in f.machines.values())


def smoke(f: Figures) -> str:
    s = f["smoke-run"]
    return para(
        f"Measured: **{f.num('smoke-run', 1)} minutes** for the three commands on 2 CPU cores "
        f"({f.when('smoke-run')}: training {s['train_s']:.0f} s, export {s['export_s']:.0f} s, "
        f"translation {s['translate_s']:.0f} s), validation BLEU {s['valid_bleu']:.2f} on "
        f"{s['valid_sentences']} sentences."
    )


BLOCKS = {
    "readme-expect": readme_expect,
    "quality": quality,
    "quality-weights": lambda f: quality(f, weights=True),
    "speed-summary": speed_summary,
    "training-speed": training_speed,
    "training-detail": training_detail,
    "real-decoding": real_decoding,
    "decoding-summary": decoding_summary,
    "xla-training": xla_training,
    "quickstart-recipe": quickstart_recipe,
    "quickstart-quality": quickstart_quality,
    "machines": machines,
    "smoke": smoke,
}


def load(path: str = DATA) -> Figures:
    with open(path, encoding="utf-8") as handle:
        return Figures(json.load(handle))


def render(text: str, figures: Figures, page: str = "") -> str:
    """`text` with every figures block regenerated; KeyError for an unknown block."""

    def block(match):
        name = match.group(2)
        if name not in BLOCKS:
            raise KeyError(f"{page}: unknown figures block {name!r}; known: {sorted(BLOCKS)}")
        return f"{match.group(1)}\n{BLOCKS[name](figures)}\n{match.group(4)}"

    return BLOCK.sub(block, text)


def stale_pages(figures: Figures | None = None, write: bool = False) -> list[str]:
    """The pages whose figures differ from the data (rewritten when `write`)."""
    figures = figures or load()
    stale = []
    for page in PAGES:
        path = os.path.join(ROOT, page)
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        new = render(text, figures, page)
        if new != text:
            stale.append(page)
            if write:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(new)
    return stale


# -- recording a benchmark's result ----------------------------------------------------------


def add_record_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        metavar="FILE",
        help="append the result to FILE (JSON: a list of records with the command, date, "
        "commit and CPU), e.g. docs/figures/recorded.json",
    )


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line]
    return names[0] if names else platform.machine()


def record(path: str | None, result, argv: list[str] | None = None) -> dict | None:
    """Append `result` (a benchmark's JSON) to the records in `path` (created if missing),
    with the command that produced it, the date, the commit and the CPU. None: no-op."""
    if not path:
        return None
    argv = sys.argv if argv is None else argv
    try:
        commit = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        commit = None
    entry = {
        "command": " ".join(["python", os.path.relpath(argv[0], ROOT), *argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "result": result,
    }
    records = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            records = json.load(handle)
    records.append(entry)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(records, handle, indent=1)
        handle.write("\n")
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--check", action="store_true", help="only report stale pages")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    stale = stale_pages(write=not args.check)
    for page in stale:
        print(f"{page}: {'stale' if args.check else 'rewritten'}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
