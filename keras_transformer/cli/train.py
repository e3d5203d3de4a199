"""Train a Transformer (default: small preset on Multi30k, en->de).

    kt-train --strategy mirrored
    kt-train --config recipes/wmt14-base.yaml --data-dir ~/tensorflow_datasets
    kt-train --config recipes/wmt14-base.yaml --dry-run   # print the resolved plan, write nothing

Values come from, lowest first: the built-in defaults, the automatic recipe (from the preset
and the corpus size), --config FILE (YAML, keys are the flag names: batch_tokens: 4096),
then the flags given here. Running again with the same --model-dir resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys

from keras_transformer.cli.parser import ArgumentParser


def build_parser(prog: str = "kt-train") -> argparse.ArgumentParser:
    """The command line, built from `TrainArgs` (one definition of every flag) plus the
    command's own --config, --dry-run and --log-level. A flag not given is absent from the
    parsed namespace (argparse.SUPPRESS), so a given flag wins even when it equals its default."""
    import dataclasses

    from keras_transformer.cli.common import add_command_flags
    from keras_transformer.settings.args import TrainArgs, argument

    parser = ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for field in dataclasses.fields(TrainArgs):
        kind = str(field.type)
        name, about = argument(field)
        meta = dict(help=about, default=argparse.SUPPRESS)
        if kind == "bool":
            parser.add_argument(name, action=argparse.BooleanOptionalAction, **meta)
            continue
        convert = int if kind.startswith("int") else float if kind.startswith("float") else str
        parser.add_argument(name, type=convert, choices=field.metadata["choices"], **meta)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a recipe: YAML whose keys are these flags' names (batch_tokens: 4096), e.g. "
        "recipes/wmt14-base.yaml or a run's config.json; the flags given here win over it",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve every setting (reading the corpus sizes), print the plan and exit: "
        "trains no tokenizer and writes nothing",
    )
    add_command_flags(parser)
    return parser


def parse_command(argv=None, prog: str = "kt-train"):
    """(TrainArgs, the command's own options): defaults < --config FILE < the flags given.

    Raises ConfigError for a bad --config FILE (naming the file and the key)."""
    import dataclasses

    from keras_transformer.files import data_dir_from_env
    from keras_transformer.settings.args import ALTERNATIVES, TrainArgs

    given = vars(build_parser(prog).parse_args(argv))
    command = argparse.Namespace(
        config=given.pop("config", None),
        dry_run=given.pop("dry_run", False),
        log_level=given.pop("log_level"),
        from_file=(),  # the flags whose value comes from --config FILE
    )
    values = {field.name: field.default for field in dataclasses.fields(TrainArgs)}
    values["data_dir"] = data_dir_from_env()
    if command.config is not None:
        from keras_transformer.settings.config_file import read_config_file

        recipe = read_config_file(command.config)
        for one, other in ALTERNATIVES:  # --epochs given here replaces the file's train_steps
            for name, rival in ((one, other), (other, one)):
                if name in given:
                    recipe.pop(rival, None)
        values.update(recipe)
        command.from_file = tuple(name for name in recipe if name not in given)
    values.update(given)
    return TrainArgs(**values), command


def where(message: str, command) -> str:
    """A flag error about a value of --config FILE says so."""
    from keras_transformer.settings.args import option

    for name in command.from_file:
        if option(name) in message.split(":")[0].split():
            return f"{message} (set by {name} in --config {command.config})"
    return message


def parse_args(argv=None, prog: str = "kt-train"):
    """The `TrainArgs` of a command line (and of its --config FILE)."""
    return parse_command(argv, prog)[0]


def main(argv=None, prog: str = "kt-train") -> int:
    # no TensorFlow yet: --help and flag errors answer at once
    from keras_transformer.cli.common import set_up_command
    from keras_transformer.config import ConfigError
    from keras_transformer.errors import KerasTransformerError

    try:
        args, command = parse_command(argv, prog)
        from keras_transformer.settings.plan import Plan

        try:
            plan = Plan.of(args)  # checked once, corpus lists parsed once
        except ConfigError as err:
            raise ConfigError(where(str(err), command)) from None
        from keras_transformer.files import check_writable_dir

        check_writable_dir(args.model_dir, "--model-dir")  # before the data and the tokenizer
        set_up_command(command.log_level)
        # the devices are configured first thing in `train` and `dry_run`
        if command.dry_run:
            from keras_transformer.training.trainer import dry_run

            print(dry_run(plan), flush=True)  # the command's output
        else:
            from keras_transformer.training.trainer import train

            print(train(plan)["report"], flush=True)  # the command's output
    except KerasTransformerError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside training steps (there: a checkpoint, 130)
        print(f"{prog}: interrupted (SIGINT): nothing more saved", file=sys.stderr)
        return 130
    return 0


def end_process(code: int) -> int:
    """End the process with exit status `code` as a normal exit would, less the interpreter's
    teardown (2.5-4 s of garbage collection of TensorFlow's objects after a run): the other
    non-daemon threads are joined and the atexit handlers run (logging's flush among them),
    stdout and stderr flushed, then `os._exit`. By the time `main` returns, every file of a
    run is written and closed or flushed: checkpoints and best/ are written synchronously
    (an --async-checkpoint write is joined), each TensorBoard event is flushed and each line
    of metrics.jsonl closed as it is written. Under TF_CONFIG (a cluster: its runtime's
    shutdown takes part in the cluster's) `code` is returned for a normal exit instead."""
    import atexit
    import os
    import threading

    if os.environ.get("TF_CONFIG"):
        return code
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: a normal exit would not write either
            pass
    os._exit(code)


def console(prog: str = "kt-train") -> int:
    """The command as a process runs it (kt-train, train.py): `main`, then `end_process`."""
    return end_process(main(prog=prog))


if __name__ == "__main__":
    sys.exit(console())
