"""One configuration of the bench's policies scenario, run in a child process so that the memory cap covers it:
`python -m longhaul_cpp.bench.capped ARGS.pickle` runs plan.record_run with the pickled keyword arguments (the
routing recorded beforehand among them, so the child loads no normal model) and prints its counters as JSON.
The parent (bench/policies.py) writes ARGS, puts the child into the cgroup and reads the JSON back."""
from __future__ import annotations

import dataclasses
import json
import pickle
import sys
from pathlib import Path
from typing import Any

from ..plan.record import PhaseRun, RecordedRun, record_run


def write_args(args_file: Path, /, **kwargs: Any) -> Path:
    """record_run's keyword arguments, for the child."""
    with open(args_file, "wb") as f:
        pickle.dump(kwargs, f)
    return args_file


def result_json(run: RecordedRun) -> str:
    return json.dumps({"prompt": dataclasses.asdict(run.prompt), "gen": dataclasses.asdict(run.gen),
                       "misses": {str(il): n for il, n in run.misses.items()}, "hit_s": run.hit_s, "flags": run.flags})


def parse_result(text: str, base: RecordedRun) -> RecordedRun:
    """The child's counters on the recorded run they replay (its routing, calls and outputs)."""
    d = json.loads(text.strip().splitlines()[-1])
    return dataclasses.replace(base, prompt=PhaseRun(**d["prompt"]), gen=PhaseRun(**d["gen"]),
                               misses={int(il): n for il, n in d["misses"].items()}, hit_s=d["hit_s"],
                               flags=d["flags"])


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m longhaul_cpp.bench.capped ARGS.pickle (written by the bench)")
    with open(argv[0], "rb") as f:
        kwargs = pickle.load(f)
    print(result_json(record_run(**kwargs)))


if __name__ == "__main__":
    main(sys.argv[1:])
