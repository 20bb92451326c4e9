"""Where an unrecognised exception was raised: the traceback's last frame. Raised inside an installed package
(site-packages) it is what that package refused or a bug of its release, not 'a bug in your training code'.
The tracebacks are real: printed by this interpreter running torch's own code and a script of ours."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.explain import explain, load_knowledge_base, open_log, scan_inputs
from ddpdoctor.parsers.pytraceback import raising_package

KB = load_knowledge_base()


def _traceback(tmp_path: Path, code: str, prefix: str = "") -> Path:
    """Run `code` in a fresh interpreter (timeout-bound) and keep its stderr, as a launcher's log would."""
    script = tmp_path / "train.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" in done.stderr, done.stderr
    log = tmp_path / "rank0.log"
    log.write_text("".join(prefix + line for line in done.stderr.splitlines(keepends=True)))
    return log


def _root(log: Path):  # noqa: ANN202
    with open_log(str(log)) as stream:
        return explain(KB, scan_inputs(KB, [("input.log", stream)])).root


LIBRARY_RAISE = "import torch.utils.data as d\nloader = d.DataLoader(list(range(8)), batch_size=-1)\n"
OWN_RAISE = "def step(batch):\n    raise KeyError('labels')\n\nstep({})\n"


@pytest.mark.parametrize("prefix", ["", "[rank0]: "])
def test_exception_raised_in_an_installed_package_names_the_package(tmp_path: Path, prefix: str) -> None:
    root = _root(_traceback(tmp_path, LIBRARY_RAISE, prefix))
    assert root is not None and root.id == "python.library_exception"
    assert root.title.startswith("ValueError raised inside torch: batch_size should be a positive integer")
    assert root.component == "torch"
    assert "site-packages/torch/utils/data/sampler.py:" in root.cause
    assert "torch's issue tracker" in root.fix
    assert root.data["frame_func"] == "__init__"


def test_exception_raised_in_the_script_stays_the_scripts(tmp_path: Path) -> None:
    root = _root(_traceback(tmp_path, OWN_RAISE))
    assert root is not None and root.id == "python.exception"
    assert "train.py:2, in step" in root.reasoning


def test_no_traceback_no_frame(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_text("ValueError: batch_size should be a positive integer value, but got batch_size=-1\n")
    root = _root(log)
    assert root is not None and root.id == "python.exception" and "frame_file" not in root.data


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/opt/conda/lib/python3.8/site-packages/fairscale/optim/oss.py", ("fairscale", "")),
        ("/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", ("deepspeed", "")),
        ("/env/lib/python3.8/site-packages/fairscale-0.4.0-py3.8.egg/fairscale/nn/misc.py", ("fairscale", "0.4.0")),
        ("/env/lib/python3.11/site-packages/six.py", ("six", "")),
        (r"C:\Python311\Lib\site-packages\torch\distributed\distributed_c10d.py", ("torch", "")),
        ("/usr/lib/python3.10/multiprocessing/queues.py", ("python", "")),
        ("/home/me/project/train.py", None),
        ("<frozen runpy>", ("python", "")),
        ("/home/me/pytorch/torch/distributed/fsdp/api.py", None),  # a source checkout: cannot tell
    ],
)
def test_raising_package(path: str, expected: tuple[str, str] | None) -> None:
    assert raising_package(path) == expected


# Messages that state their own refusal, quoted from the spent held-out logs (provenance in their READMEs):
# set 11 e07 (unslothai/unsloth), set 6 f01 (Lightning-AI/lit-llama#113), set 9 f03 (EleutherAI/gpt-neox#757).
STATED_REFUSALS = [
    "RuntimeError: Unsloth currently does not work on multi GPU setups - sadly we are a 2 brother team so enabling it "
    "will require much more work, so we have to prioritize. Please understand!",
    "NotImplementedError: offload_to_cpu=True and NO_SHARD is not supported yet",
    "AssertionError: NeoXArgs.calculate_derived() (global_num_gpus / pp_size) / mp_size [(4 / 4) / 2] must be a whole "
    "number",
]


@pytest.mark.parametrize("line", STATED_REFUSALS)
def test_an_exception_that_states_its_refusal_is_that_cause(tmp_path: Path, line: str) -> None:
    log = tmp_path / "rank0.log"
    log.write_text(f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    main()\n{line}\n')
    root = _root(log)
    assert root is not None and root.id == "message.stated_cause", root
    assert line[:60] in root.title and root.cause.startswith(f'The message states it: "{line[:40]}')


def test_a_plain_exception_states_no_refusal(tmp_path: Path) -> None:
    # Near miss: a message that says what went wrong but no refusal or instruction stays the generic exception.
    log = tmp_path / "rank0.log"
    log.write_text('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    main()\n'
                   "KeyError: 'labels'\n")
    root = _root(log)
    assert root is not None and root.id == "python.exception", root


def test_a_refusal_raised_inside_a_package_keeps_the_package_and_quotes_the_refusal(tmp_path: Path) -> None:
    # torch's DataLoader raises "batch_size should be a positive integer value" — no stated refusal — so a real
    # refusal is written into a frame of torch's own file by the traceback of a real run: the last frame is torch's.
    log = _traceback(tmp_path, LIBRARY_RAISE)
    text = log.read_text().splitlines()
    text[-1] = "ValueError: batch_size=-1 is not supported, batch_size must be a positive integer"
    log.write_text("\n".join(text) + "\n")
    root = _root(log)
    assert root is not None and root.id == "python.library_exception", root
    assert root.cause.startswith('The message states it: "ValueError: batch_size=-1 is not supported'), root.cause
