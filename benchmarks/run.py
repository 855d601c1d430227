"""Head-to-head runner: ``python -m benchmarks.run --bench hotpotqa --optimizers baseline,agentgrad,gepa,miprov2
--task-lm LM --prompt-lm LM --max-metric-calls N --seed S --out DIR [--table ablation|transfer|time]``.

Writes ``DIR/results.json`` (after every optimizer, so an interrupted run resumes where it stopped),
``DIR/results.md`` (Table-1-style scores and a details table) and ``DIR/val_curves.png``; with
``--table``, also ``DIR/<table>.json`` and ``DIR/<table>.md``, laid out like the paper's table:

  ablation  AgentGrad's four ablation rows (plain textual gradients, + target identification,
            + agent-level supervision, + semantic abstraction = full) on each --bench
  transfer  optimize on the source benchmark, evaluate the optimized programs unchanged on the target:
            pupa -> PUPA-TNB (offline), hotpotqa -> 2WikiMultiHopQA (online only)
  time      wall clock per optimizer per benchmark, from the runs' own records
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DataUnavailable, MissingExtra
from benchmarks.harness import ABLATION, OPTIMIZERS, evaluate_program, run_optimizer
from benchmarks.lms import LMSpecError, describe_spec
from benchmarks.paper_tables import BUILDERS, TABLES
from benchmarks.presets import PAPER, PRESETS, gepa_variant, merge_options, optimizer_options
from benchmarks.registry import BENCHMARKS, PAPER_SIZES, load_benchmark
from benchmarks.report import markdown_report, plot_curves, write_json
from benchmarks.transfer import TARGETS, load_target
from dspy_agentgrad.reporting.paired import PairedChange

logger = logging.getLogger("benchmarks.run")

DEFAULT_OPTIMIZERS = "baseline,agentgrad,gepa,miprov2"
ABLATION_OPTIMIZERS = (*ABLATION, "agentgrad")
RESULTS_FILE = "results.json"
REPORT_FILE = "results.md"
PLOT_FILE = "val_curves.png"
#: Settings that must match for a results file to be resumed.
RESUME_KEYS = (
    "task_lm",
    "prompt_lm",
    "untrusted_lm",
    "judge_lm",
    "max_metric_calls",
    "max_task_tokens",
    "seed",
    "split_seed",
    "sizes",
    "corpus",
    "source",
    "cache",
    "options",
    "preset",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bench", required=True, help=f"benchmark(s), comma-separated: {', '.join(BENCHMARKS)}")
    p.add_argument(
        "--optimizers",
        default=None,
        help="comma-separated, from: " + ", ".join(OPTIMIZERS) + " (the baseline always runs: gains need it; "
        f"default: {DEFAULT_OPTIMIZERS}, with --table ablation: {','.join(ABLATION_OPTIMIZERS)}). textgrad needs "
        "the [textgrad] extra; the agentgrad-* names are AgentGrad with components switched off",
    )
    p.add_argument(
        "--table",
        default=None,
        choices=TABLES,
        help="also lay the results out as one of the paper's other tables (see above): ablation, transfer "
        f"(sources: {', '.join(TARGETS)}), time",
    )
    p.add_argument(
        "--task-lm",
        required=True,
        help="litellm model[@api_base] (e.g. openai/gpt-5-mini, openai/qwen3-8b@http://localhost:8000/v1), "
        "'local' (embedded model) or 'fake' (rule-based, for tests)",
    )
    p.add_argument("--prompt-lm", default=None, help="LM of the optimizers' own roles (default: the task LM)")
    p.add_argument(
        "--untrusted-lm",
        default=None,
        help="PUPA: the external model that answers the redacted request (default: the task LM)",
    )
    p.add_argument("--judge-lm", default=None, help="PUPA: the LLM judge of quality and leakage (default: the task LM)")
    p.add_argument(
        "--max-metric-calls",
        type=int,
        default=None,
        help="budget per optimizer in metric calls (program run + metric on one example); "
        "default: each optimizer's 'light' setting",
    )
    p.add_argument(
        "--max-task-tokens",
        type=int,
        default=None,
        help="task-LM token budget per optimizer as well: a hard cap for AgentGrad (max_task_tokens), a stop "
        "checked between iterations for GEPA (it can pass the cap by one iteration); MIPROv2 has no hook "
        "for it (its spend is reported)",
    )
    p.add_argument(
        "--preset",
        default=None,
        choices=PRESETS,
        help="paper: per benchmark the papers' splits (where the data allow), the GEPA paper's metric-call "
        "budget for every optimizer, GEPA without merge, MIPROv2 with 18 candidates and an error budget "
        "as large as its metric-call budget; flags given explicitly override it",
    )
    p.add_argument("--seed", type=int, default=0, help="optimizer seed")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the train/val/test split")
    p.add_argument("--train", type=int, default=None, help=f"train size (default: {PAPER_SIZES['train']})")
    p.add_argument("--val", type=int, default=None, help=f"val size (default: {PAPER_SIZES['val']})")
    p.add_argument("--test", type=int, default=None, help="test size (default: 300; IFBench: all 294 test prompts)")
    p.add_argument("--num-threads", type=int, default=4)
    p.add_argument(
        "--corpus",
        default="auto",
        help="retrieval corpus: auto (Wikipedia 2017 abstracts when available; HotpotQA falls back to "
        "the pooled offline paragraphs), wiki, pooled (HotpotQA only)",
    )
    p.add_argument(
        "--source",
        default="offline",
        choices=("offline", "online"),
        help="HotpotQA, HoVer (train) and PUPA data: the shared offline files, or the original sources online",
    )
    p.add_argument(
        "--cache",
        default="per-optimizer",
        choices=("per-optimizer", "off"),
        help="DSPy LM cache: a fresh cache dir per (benchmark, optimizer) under DIR/cache, or no cache",
    )
    p.add_argument(
        "--options",
        default="{}",
        help='JSON of extra optimizer options, e.g. \'{"gepa": {"use_merge": false}, '
        '"miprov2": {"max_bootstrapped_demos": 0, "max_labeled_demos": 0}}\'',
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--fresh", action="store_true", help="ignore an existing results file in --out")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _lms(args, bench, also: list | tuple = ()):
    """Task, prompt and the benchmark's extra LMs; ``also``: more examples the fake world must know
    (a transfer target's)."""
    from benchmarks.lms import make_lm

    rule = None
    if "fake" in (args.task_lm, args.prompt_lm):
        from benchmarks.fake_world import BenchWorld

        rule = BenchWorld(bench.trainset + bench.valset + bench.testset + list(also))
    task = make_lm(args.task_lm, fake_rule=rule, cache=args.cache != "off")

    def role_lm(spec: str | None):
        if (spec or args.task_lm) == args.task_lm:
            return task.copy()  # one model loaded once; another instance so usage is told apart by role
        return make_lm(spec, fake_rule=rule, cache=args.cache != "off")

    prompt = role_lm(args.prompt_lm)
    extra = {role: role_lm(getattr(args, f"{role}_lm", None)) for role in bench.lm_roles}
    if bench.bind_lms is not None:
        bench.bind_lms(extra)
    return task, prompt, extra


def _config(args, optimizers) -> dict[str, Any]:
    return {
        "task_lm": args.task_lm,
        "prompt_lm": args.prompt_lm or args.task_lm,
        "untrusted_lm": args.untrusted_lm,
        "judge_lm": args.judge_lm,
        "max_metric_calls": args.max_metric_calls,
        "max_task_tokens": args.max_task_tokens,
        "seed": args.seed,
        "split_seed": args.split_seed,
        "sizes": {"train": args.train, "val": args.val, "test": args.test}
        if args.preset
        else {"train": args.train or PAPER_SIZES["train"], "val": args.val or PAPER_SIZES["val"], "test": args.test},
        "corpus": args.corpus,
        "source": args.source,
        "cache": args.cache,
        "options": json.loads(args.options or "{}"),
        "preset": args.preset,
        "lm_settings": {role: describe_spec(spec) for role, spec in _specs(args).items()},
        "num_threads": args.num_threads,
        "optimizers": optimizers,
    }


def _specs(args) -> dict[str, str]:
    specs = {"task": args.task_lm, "prompt": args.prompt_lm or args.task_lm}
    specs.update({role: getattr(args, f"{role}_lm") for role in ("untrusted", "judge") if getattr(args, f"{role}_lm")})
    return specs


def bench_settings(args, bench_name: str) -> dict[str, Any]:
    """Sizes, split, budget and optimizer options of one benchmark: the flags, over the preset if any."""
    user_options = json.loads(args.options or "{}")
    if args.preset is None or bench_name not in PAPER:  # a benchmark of no paper runs on the flags alone
        return {
            "train": args.train or PAPER_SIZES["train"],
            "val": args.val or PAPER_SIZES["val"],
            "test": args.test,
            "split": "seeded",
            "max_metric_calls": args.max_metric_calls,
            "options": user_options,
            "gepa_variant": gepa_variant(user_options),
        }
    paper = PAPER[bench_name]
    fallback = paper.offline_sizes is not None and args.source == "offline"  # the data cannot hold the split
    sizes = paper.offline_sizes if fallback else paper.sizes
    budget = args.max_metric_calls or paper.budget
    options = merge_options(optimizer_options(budget), user_options)
    return {
        "train": args.train or sizes[0],
        "val": args.val or sizes[1],
        "test": args.test or sizes[2],
        "split": "seeded" if fallback else "paper",
        "max_metric_calls": budget,
        "options": options,
        "gepa_variant": gepa_variant(options),
        "paper_setup": paper.split,
        "differs_offline": paper.offline if args.source == "offline" else None,
    }


def _cut_paper_split(bench, args) -> None:
    """Explicit --train/--val/--test with the paper preset keep the first N examples of each paper split
    (a smaller run on the same data)."""
    for name, size in (("trainset", args.train), ("valset", args.val), ("testset", args.test)):
        if size is not None:
            setattr(bench, name, getattr(bench, name)[:size])
    bench.info["sizes"] = {"train": len(bench.trainset), "val": len(bench.valset), "test": len(bench.testset)}
    if any(size is not None for size in (args.train, args.val, args.test)):
        bench.info["split"] = f"{bench.info.get('split')}, first N of each part"


def _load_previous(path: Path, config: dict, fresh: bool) -> dict:
    if fresh or not path.exists():
        return {"config": config, "benchmarks": {}}
    previous = json.loads(path.read_text())
    old = previous.get("config", {})
    diff = [k for k in RESUME_KEYS if old.get(k) != config.get(k)]
    if diff:
        raise SystemExit(
            f"{path} was written with different settings ({', '.join(diff)}); "
            "use another --out or pass --fresh to start over"
        )
    previous["config"] = {**old, **config}
    return previous


def run_benchmark(bench_name: str, args, optimizers: list[str], results: dict, out: Path) -> None:
    block = results["benchmarks"].setdefault(bench_name, {"optimizers": {}})
    settings = bench_settings(args, bench_name)
    block["settings"] = settings
    corpus = args.corpus
    if bench_name == "hover" and corpus == "pooled":
        corpus = "auto"  # "pooled" is HotpotQA's offline corpus; HoVer has none (clear error below)
    try:
        bench = load_benchmark(
            bench_name,
            train=settings["train"],
            val=settings["val"],
            test=settings["test"],
            seed=args.split_seed,
            split=settings["split"],
            **({"corpus": corpus} if bench_name in ("hotpotqa", "hover") else {}),
            **({"source": args.source} if bench_name != "ifbench" else {}),
        )
    except (DataUnavailable, MissingExtra, ValueError, FileNotFoundError) as exc:
        block.update(status="unavailable", error=str(exc))
        logger.error("[%s] cannot run: %s", bench_name, exc)
        return
    if settings["split"] == "paper":
        _cut_paper_split(bench, args)
    block.update(status="loaded", info=bench.info)
    block.pop("error", None)
    target = _transfer_target(bench_name, bench, args, block) if args.table == "transfer" else None
    if args.table == "transfer" and target is None:
        block["status"] = "partial"  # optimizing for a transfer that cannot be evaluated would waste the budget
        return
    task_lm, prompt_lm, extra_lms = _lms(args, bench, also=target.examples if target else ())
    options = merge_options(bench.optimizer_options, settings["options"])
    entries = block["optimizers"]
    for index, name in enumerate(optimizers, 1):
        if entries.get(name, {}).get("status") == "done":
            logger.info("[%s] %s already finished in %s, skipping", bench_name, name, out / RESULTS_FILE)
            continue
        logger.info(
            "[%s] (%d/%d) %s: starting (budget %s metric calls)",
            bench_name,
            index,
            len(optimizers),
            name,
            settings["max_metric_calls"],
        )
        cache_dir = "off" if args.cache == "off" else out / "cache" / bench_name / name
        started = time.time()
        try:
            run = run_optimizer(
                name,
                bench.make_program(),
                bench.trainset,
                bench.valset,
                bench.metric,
                task_lm=task_lm,
                prompt_lm=prompt_lm,
                max_metric_calls=None if name == "baseline" else settings["max_metric_calls"],
                max_task_tokens=None if name == "baseline" else args.max_task_tokens,
                seed=args.seed,
                num_threads=args.num_threads,
                hint_fn=bench.hint,
                log_dir=out / "logs" / bench_name / name,
                cache_dir=cache_dir,
                options=options,
                extra_lms=extra_lms,
            )
            test_score, test_calls, test_scores = evaluate_program(
                run.program, bench.testset, bench.metric, task_lm=task_lm, num_threads=args.num_threads
            )
        except Exception as exc:  # keep what finished; a rerun resumes here
            logger.exception("[%s] %s failed", bench_name, name)
            entries[name] = {
                "status": "failed",
                "error": f"{type(exc).__name__}: {exc}",
                "wall_time_s": time.time() - started,
            }
            write_json(out / RESULTS_FILE, results)
            continue
        entry = run.to_dict()
        entry.update(status="done", test_score=test_score, test_metric_calls=test_calls, test_scores=test_scores)
        programs = out / "programs" / bench_name
        programs.mkdir(parents=True, exist_ok=True)
        run.program.save(str(programs / f"{name}.json"))
        entries[name] = entry
        _update_gains(entries)
        write_json(out / RESULTS_FILE, results)
        logger.info(
            "[%s] %s: done -- val %.4f, test %.4f, %d metric calls, %.1fs",
            bench_name,
            name,
            run.val_score or 0.0,
            test_score,
            run.metric_calls,
            run.wall_time_s,
        )
    block["status"] = "done" if all(entries.get(n, {}).get("status") == "done" for n in optimizers) else "partial"
    if target is not None:
        _evaluate_transfer(target, block, out / "programs" / bench_name, task_lm, args.num_threads)


def _transfer_target(bench_name: str, bench, args, block: dict):
    """The benchmark's transfer target, or None (recorded in the block) when it cannot be loaded."""
    try:
        target = load_target(bench_name, bench, size=args.test, seed=args.split_seed)
    except (DataUnavailable, ValueError, FileNotFoundError) as exc:
        block["transfer"] = {"target": TARGETS.get(bench_name), "status": "unavailable", "error": str(exc)}
        logger.error("[%s] transfer target cannot be loaded: %s", bench_name, exc)
        return None
    previous = block.get("transfer") or {}
    scores = previous.get("scores", {}) if previous.get("target") == target.name else {}
    block["transfer"] = {"target": target.name, "status": "loaded", "info": target.info, "scores": scores}
    return target


def _evaluate_transfer(target, block: dict, programs: Path, task_lm, num_threads: int) -> None:
    """Each finished optimizer's program, loaded from its saved state into the target's program, scored
    on the target's examples unchanged."""
    scores = block["transfer"]["scores"]
    for name, entry in block["optimizers"].items():
        if entry.get("status") != "done" or name in scores:
            continue
        program = target.make_program()
        program.load(str(programs / f"{name}.json"))
        score, calls, _ = evaluate_program(
            program, target.examples, target.metric, task_lm=task_lm, num_threads=num_threads
        )
        scores[name] = {"target": score, "target_metric_calls": calls, "source_test": entry["test_score"]}
        logger.info("[transfer to %s] %s: %.4f", target.name, name, score)
    block["transfer"]["status"] = "done"


def _update_gains(entries: dict) -> None:
    """Each finished optimizer's test gain over the baseline, and its paired standard error when both runs kept
    their per-example scores on the same test examples."""
    base = entries.get("baseline", {})
    done = base.get("status") == "done"
    base_test = base.get("test_score") if done else None
    base_scores = base.get("test_scores") if done else None
    for entry in entries.values():
        if entry.get("status") == "done":
            entry["gain"] = None if base_test is None else entry["test_score"] - base_test
            scores = entry.get("test_scores")
            paired = base_scores is not None and scores is not None and len(scores) == len(base_scores)
            entry["gain_se"] = PairedChange.of(base_scores, scores).standard_error if paired else None


def _block(results: dict, bench: str) -> dict:
    return results["benchmarks"].get(bench, {})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("dspy", "LiteLLM", "httpx", "gepa"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("dspy.agentgrad").setLevel(logging.DEBUG if args.verbose else logging.INFO)  # AgentGrad's story
    benches = [b.strip() for b in args.bench.split(",") if b.strip()]
    unknown = [b for b in benches if b not in BENCHMARKS]
    default = ",".join(ABLATION_OPTIMIZERS) if args.table == "ablation" else DEFAULT_OPTIMIZERS
    optimizers = [o.strip() for o in (args.optimizers or default).split(",") if o.strip()]
    bad = [o for o in optimizers if o not in OPTIMIZERS]
    if unknown or bad:
        raise SystemExit(f"unknown benchmark(s) {unknown} / optimizer(s) {bad}")
    if args.table == "transfer" and any(b not in TARGETS for b in benches):
        raise SystemExit(f"--table transfer: the source benchmarks with a target are {', '.join(TARGETS)}")
    if "baseline" in optimizers:
        optimizers.remove("baseline")
    optimizers.insert(0, "baseline")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        config = _config(args, optimizers)
    except LMSpecError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.fresh:  # resumable optimizer state and cached LM calls of the old run must not leak in
        import shutil

        for sub in ("logs", "cache", "programs"):
            shutil.rmtree(out / sub, ignore_errors=True)
    results = _load_previous(out / RESULTS_FILE, config, args.fresh)
    for bench in benches:
        run_benchmark(bench, args, optimizers, results, out)
        write_json(out / RESULTS_FILE, results)
    (out / REPORT_FILE).write_text(markdown_report([results]), encoding="utf-8")
    plot_curves([results], out / PLOT_FILE)
    logger.info("wrote %s, %s, %s", out / RESULTS_FILE, out / REPORT_FILE, out / PLOT_FILE)
    if args.table:
        data, table = BUILDERS[args.table](results)
        write_json(out / f"{args.table}.json", data)
        (out / f"{args.table}.md").write_text(table, encoding="utf-8")
        logger.info("wrote %s, %s", out / f"{args.table}.json", out / f"{args.table}.md")
    failed = [
        (b, n)
        for b in benches
        for n, e in results["benchmarks"].get(b, {}).get("optimizers", {}).items()
        if e.get("status") != "done"
    ]
    unavailable = [b for b in benches if results["benchmarks"].get(b, {}).get("status") == "unavailable"]
    for b in unavailable:
        print(f"error: {b}: {results['benchmarks'][b]['error']}", file=sys.stderr)
    no_target = [b for b in benches if _block(results, b).get("transfer", {}).get("status") == "unavailable"]
    for b in no_target:
        print(f"error: {b} transfer: {results['benchmarks'][b]['transfer']['error']}", file=sys.stderr)
    return 2 if unavailable or failed or no_target else 0


if __name__ == "__main__":
    sys.exit(main())
