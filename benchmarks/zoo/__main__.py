"""``python -m benchmarks.zoo --worlds 40 --seed 0 --threads 8 --jobs 2 --out DIR [--ablate]``.

Draws ``--worlds`` worlds with ``--seed`` (:func:`benchmarks.zoo.worlds.draw_world`), runs the head-to-head
variants (and with ``--ablate`` AgentGrad with each mechanism off) on each, ``--jobs`` worlds at a time in separate
processes, and writes DIR/worlds/worldNNN.json (one per world, rewritten after each run: a killed zoo run again
with the same options resumes), DIR/zoo.json (the options, the distributions and every drawn world),
DIR/summary.json, DIR/summary.md and DIR/ratios.png. ``--summary-only`` rewrites the summary from the files.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.zoo.runner import ABLATIONS, MAIN, VARIANTS, ZooSettings, run_world
from benchmarks.zoo.summary import summarize
from benchmarks.zoo.worlds import DISTRIBUTIONS, draw_world


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__)
    p.add_argument("--worlds", type=int, default=40)
    p.add_argument("--first-world", type=int, default=0, help="draw worlds FIRST .. FIRST+WORLDS-1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--jobs", type=int, default=2, help="worlds run at once, each in its own process")
    p.add_argument("--out", required=True)
    p.add_argument("--variants", help=f"comma-separated, from: {', '.join(VARIANTS)} (default: the head-to-head)")
    p.add_argument("--ablate", action="store_true", help="also run every ablation variant")
    p.add_argument("--train", type=int, default=50)
    p.add_argument("--val", type=int, default=50)
    p.add_argument("--test", type=int, default=100)
    p.add_argument("--budget", type=int, help="metric calls per run (default 400 up to 4 steps, 600 above)")
    p.add_argument("--task-ms", type=float, default=30.0, help="simulated latency of a task-LM call")
    p.add_argument("--prompt-ms", type=float, default=80.0, help="simulated latency of a prompt-LM call")
    p.add_argument(
        "--paraphrase",
        type=float,
        help="in every world, the share of instruction-writing prompt-LM calls that reword what they return "
        "(default: drawn per world)",
    )
    p.add_argument("--summary-only", action="store_true")
    args = p.parse_args(argv)
    names = re.split(r",(?![^()]*\))", args.variants) if args.variants else list(MAIN)  # "(3,2,1)" stays whole
    names += list(ABLATIONS) if args.ablate else []
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if "gepa" not in names:
        p.error("every ratio is to GEPA: keep gepa among the variants")
    args.names = list(dict.fromkeys(names))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("benchmarks.zoo").setLevel(logging.INFO)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = ZooSettings(
        args.threads, args.train, args.val, args.test, args.task_ms / 1000, args.prompt_ms / 1000, args.budget
    )
    worlds = range(args.first_world, args.first_world + args.worlds)
    specs = [draw_world(i, args.seed) for i in worlds]
    if args.paraphrase is not None:
        specs = [replace(spec, paraphrase=args.paraphrase) for spec in specs]
    header = {
        "command": "python -m benchmarks.zoo " + shlex.join(sys.argv[1:] if argv is None else argv),
        "seed": args.seed,
        "variants": args.names,
        "settings": asdict(settings),
        "distributions": DISTRIBUTIONS,
        "worlds": [s.as_dict() for s in specs],
    }
    earlier = json.loads((out / "zoo.json").read_text()) if (out / "zoo.json").exists() else {}
    if args.summary_only:  # the title names the folder's last run, not the command that only summarizes it
        header["command"] = (earlier.get("commands") or [header["command"]])[-1]
    else:  # a later command on the same folder (more variants, more worlds) is added to the list
        header["commands"] = [*earlier.get("commands", []), header.pop("command")]
        header["worlds"] = list({w["index"]: w for w in [*earlier.get("worlds", []), *header["worlds"]]}.values())
        (out / "zoo.json").write_text(json.dumps(header, indent=1))
        started = time.perf_counter()
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(run_world, spec, args.names, settings, out): spec for spec in specs}
            for future in as_completed(futures):
                future.result()
                print(f"world {futures[future].index} done ({time.perf_counter() - started:.0f}s)", flush=True)
    title = (
        f"# Zoo: {args.worlds} worlds, seed {args.seed}, {args.threads} threads, {args.jobs} worlds at a time\n\n"
        f"`{header.get('command') or header['commands'][-1]}`; the commands, distributions and every world's "
        "knobs are in zoo.json."
    )
    summarize(out, title)
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
