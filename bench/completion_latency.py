"""Tab completion of the sandboxed kernel against stock ipykernel, in one run.

    .venv/bin/python bench/completion_latency.py [--rounds 6] [--load]

What a user feels pressing Tab: a ``complete_request`` and its reply,
through jupyter_client, with pandas imported and a DataFrame made. The first
completion of a kernel loads jedi's grammar and the builtins' stubs (both
kernels pay it once); the figures are the medians of later ones, made right
after a cell (the sandbox answers from a process forked from the one that
ran it) and again without a cell between. The kernels take turns. Ratios
are sandbox / ipykernel. Nothing is asserted: the figures go into the
issue notes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kernel_latency import compare_and_save, one_busy_process, start  # bench/ is the script's folder, first on sys.path

SETUP = "value_of_a = 41\nimport pandas as pd\ndf = pd.DataFrame({'a': [1]})"
#: a name of the namespace, a module's attribute, an object's method, a module name
CODES = ("value_of", "pd.read_c", "df.gro", "import o")


def _complete(kc: Any, code: str) -> float:
    started = time.perf_counter()
    reply = kc.complete(code, reply=True, timeout=120)
    elapsed = time.perf_counter() - started
    assert reply["content"]["matches"], (code, reply["content"])
    return elapsed


def measure(names: tuple[str, ...], rounds: int, root: Path) -> dict[str, dict[str, float]]:
    kernels = {name: start(name, root / name) for name in names}
    times: dict[str, dict[str, list[float]]] = {n: {"first": [], "after a cell": [], "again": []} for n in names}
    try:
        for name, (_, kc, _) in kernels.items():
            kc.execute_interactive(SETUP, timeout=120)
            times[name]["first"].append(_complete(kc, CODES[0]))
        for turn in range(rounds):
            for name, (_, kc, _) in kernels.items():
                kc.execute_interactive(f"value_of_a += {turn}", timeout=120)
                time.sleep(0.3)  # the user reads the output, then types
                for code in CODES:
                    times[name]["after a cell"].append(_complete(kc, code))
                for code in CODES:
                    times[name]["again"].append(_complete(kc, code))
    finally:
        for km, kc, _ in kernels.values():
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    return {n: {k: statistics.median(v) for k, v in per.items()} for n, per in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--load", action="store_true", help="also measure with one busy process on a core")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "completion_latency.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        both = measure(("python3", "sandbox-python"), args.rounds, Path(tmp))
    compare_and_save(both["python3"], both["sandbox-python"], args.out, rounds=args.rounds)
    if args.load:
        print("--- one busy process")
        with one_busy_process(), tempfile.TemporaryDirectory() as tmp:
            both = measure(("python3", "sandbox-python"), args.rounds, Path(tmp))
        compare_and_save(
            both["python3"],
            both["sandbox-python"],
            args.out.with_name(args.out.stem + "_loaded.json"),
            rounds=args.rounds,
        )


if __name__ == "__main__":
    main()
