"""The CLI: python -m harness {bench, doctor, models, pairs, humaneval, sandbox, reference}. Errors print one line, no traceback.

One module per command group (harness/cli/<group>.py), each with its parser and its commands;
this module builds the parser from them and dispatches.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from harness.cli import bench, doctor, history, humaneval, models, reference, sandbox
from harness.core import termination
from harness.workload import registry
from harness.core.errors import BadInputError, HarnessError, IntegrityError, MissingModelError, UnsupportedHereError

EXIT_STATUSES = f"""exit status:
  0    done
  1    some items failed (models fetch, humaneval evaluate, sandbox selftest): the lines above name them
  {BadInputError.exit_status}    bad input: an option, environment variable, file or registry entry is wrong; fix it
       (argparse's usage errors, and an OS error on a path: missing, no permission, disk full)
  {MissingModelError.exit_status}    a model is not here: fetch it (the message gives the command)
  {UnsupportedHereError.exit_status}    this machine cannot do it (kernel, device, sandbox, git history): run it where it can
  {IntegrityError.exit_status}    stored data failed its checksum or schema, or is of another version: restore or regenerate it
  130  interrupted (Ctrl-C)
  {termination.EXIT_STATUS}  terminated (SIGTERM)"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0], epilog=EXIT_STATUSES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--matrix", type=Path, default=None, help="registry file (default: harness/matrix.toml)")
    p.add_argument(registry.USER_REGISTRY_OPTION, dest="user_registry", type=Path, default=None, metavar="PATH",
                   help="your own registry file merged over the packaged one: models, pairs, prompt sets, or single "
                        f"values of existing ones (default: ${registry.USER_REGISTRY_ENV} if set; docs/adding.md)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    bench.add_parser(sub)
    doctor.add_parser(sub)
    models.add_parsers(sub)
    humaneval.add_parser(sub)
    sandbox.add_parser(sub)
    reference.add_parser(sub)
    history.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "bench" in argv:  # the reference example's command line, as its users have it in their history
        at = argv.index("bench") + 1
        argv = argv[:at] + bench.reference_spellings(argv[at:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        with termination.sigterm_as_interrupt():  # SIGTERM cleans up on the way out, as Ctrl-C does
            return _dispatch(args)
    except HarnessError as exc:  # the status of its kind (harness/core/errors.py)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_status
    except OSError as exc:  # disk full, permission denied, a folder where a file should be: the path, not a traceback
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        print(f"error: {where + ': ' if where else ''}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except termination.Terminated:
        print("terminated", file=sys.stderr)
        return termination.EXIT_STATUS
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "history":  # reads the run history only: no models, so no transformers (2 s) and no registry
        return history.run(args)
    import transformers

    transformers.logging.set_verbosity_error()
    matrix = registry.load_matrix(args.matrix, user=args.user_registry)
    if args.command == "bench":
        return bench.run(matrix, args)
    if args.command == "doctor":
        return doctor.run(matrix, args)
    if args.command == "humaneval":
        return humaneval.run(matrix, args)
    if args.command == "sandbox":
        return sandbox.run(args)
    if args.command == "reference":
        return reference.run(args)
    return models.run(matrix, args)
