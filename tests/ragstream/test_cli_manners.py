"""The command line's manners: quiet on a closed pipe, full names and defaults in every --help,
the dev tools' light commands without the services' imports, secrets masked and nothing else."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.settings import settings_report
from ragdev.cli import BENCHMARKS
from ragdev.eval.configs import DEFAULT_CONFIGS
from ragstream.cli import DEV_STACK_FILE, build_parser, main
from streams.settings import IngestSettings

pytestmark = pytest.mark.unit


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    choices: dict[str, argparse.ArgumentParser] = actions[0].choices
    return choices


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    """`ragstream ... | head`: the reader goes away; no BrokenPipeError traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ragstream.cli", "config"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 141  # 128 + SIGPIPE, as a shell reports `cat` killed by it


def test_every_subcommand_help_names_it_in_full_and_shows_its_defaults() -> None:
    subcommands = _subcommands(build_parser())
    assert {"query", "config", "reindex", "sor", "dev", "bench", "eval"} <= set(subcommands)
    for name, parser in subcommands.items():
        text = parser.format_help()
        assert text.startswith(f"usage: ragstream {name} "), text[:80]
        for action in parser._actions:
            shown = action.default not in (None, False, [], argparse.SUPPRESS)
            if action.option_strings and shown:
                assert f"(default: {action.default}" in " ".join(text.split()) or (
                    "(default: " in (action.help or "")
                ), f"ragstream {name} {action.option_strings[0]}: no default in --help"


@pytest.mark.parametrize("target", sorted(BENCHMARKS))
def test_each_benchmark_help_names_it_in_full(target: str) -> None:
    module = importlib.import_module(f"ragdev.bench.{target}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        module.main(["--help"], prog=f"ragstream bench {target}")
    assert exited.value.code == 0
    assert out.getvalue().startswith(f"usage: ragstream bench {target} ")


def test_bench_and_eval_help_list_their_targets_and_configurations() -> None:
    subcommands = _subcommands(build_parser())
    bench = " ".join(subcommands["bench"].format_help().split())
    for target, what in BENCHMARKS.items():
        assert f"{target}: {what}" in bench
    evaluate = " ".join(subcommands["eval"].format_help().split())
    assert ", ".join(DEFAULT_CONFIGS) in evaluate
    assert "golden | manpages | faqs" in evaluate


def test_sor_loads_neither_service_nor_model_runtime() -> None:
    """`ragstream sor` answers at once: it imports the SoR writers, not the services, the
    vector stores, the model runtimes or gRPC (`python -X importtime` showed those cost
    seconds)."""
    code = (
        "import sys\n"
        "from ragstream.cli import main\n"
        "code = main(['sor', 'get', '--id', 'x', '--data-dir', sys.argv[1]])\n"
        "import ragdev.sor.embedded, ragdev.sor.postgres_writer\n"
        "heavy = ['streams', 'retrieval_api', 'onnxruntime', 'grpc', 'qdrant_edge',\n"
        "         'qdrant_client', 'prometheus_client', 'httpx', 'tokenizers', 'numpy']\n"
        "print(code, sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "no-such-data-dir"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split("\n")[0] == "2 []", done.stdout + done.stderr
    assert "no running dev stack" in done.stderr


def test_config_masks_secrets_and_nothing_else() -> None:
    plan = PlanConfig(tables=(TableMapping(format_metadata_key="format"),))
    report = settings_report(IngestSettings(plan=plan))
    assert report["plan"]["tables"][0]["format_metadata_key"] == "format"
    assert report["kafka"]["ssl_key_location"] is None  # a path, shown when set


def test_config_dev_shows_the_running_stack_s_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {"ingest": {"kafka": {"bootstrap_servers": "127.0.0.1:1"}}, "retrieve": {}}
    (tmp_path / DEV_STACK_FILE).write_text(json.dumps({"kafka": "x", "settings": settings}))
    assert main(["config", "--dev", "--service", "ingest", "--data-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"ingest": settings["ingest"]}
    assert main(["config", "--dev", "--data-dir", str(tmp_path / "none")]) == 2
    assert "no running dev stack" in capsys.readouterr().err
