"""One `hetserve tune` session: the sweep with its progress bar, then the table, the written
config and the report, whatever way the sweep ended."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from tritonclient.grpc import model_config_pb2

from accelerators import safe_files
from accelerators.engine_factory import DeviceSpec
from service.clients.progress import progress_bar
from service.clients.tune import rank, report, space
from service.clients.tune.measure import LoadSettings, Measurement, Workspace, request_inputs
from service.clients.tune.sweep import (
    ShippedConfigError,
    SweepResult,
    SweepSettings,
    sweep,
    winner,
)

ORIGINAL_SUFFIX = ".orig"  # config.pbtxt.orig, kept by --write


class BadInputError(ValueError):
    """Exit status 2, with this message."""


@dataclass(frozen=True)
class Plan:
    model: str
    model_dir: Path
    config: model_config_pb2.ModelConfig
    shipped_text: str
    devices: list[DeviceSpec]
    objective: str
    p99_ms: float | None
    budget_s: float
    concurrencies: tuple[int, ...]
    seconds: float
    clients: int
    perf_analyzer: str | None
    serve_args: tuple[str, ...]
    report_dir: Path
    write: bool
    force: bool  # root may write into folders other users own (safe_files.open_folder)
    command: str
    started: str
    host: str


def run(plan: Plan, console: Console, progress_console: Console) -> int:
    load = LoadSettings(plan.concurrencies, plan.seconds, plan.clients, plan.perf_analyzer,
                        plan.p99_ms, plan.serve_args)
    client = (f"perf_analyzer ({plan.perf_analyzer})" if plan.perf_analyzer else
              f"hetserve's load client ({plan.clients} process{'es' * (plan.clients > 1)})")
    info = report.RunInfo(plan.model, plan.model_dir, plan.objective, plan.p99_ms,
                          plan.budget_s, plan.command, plan.started, plan.host, client,
                          [str(d) for d in plan.devices], plan.concurrencies, plan.seconds)
    result = SweepResult()
    workspace = Workspace(plan.model_dir)
    try:
        with progress_bar(progress_console) as bar:
            task = bar.add_task("starting", total=plan.budget_s)

            def progress(step: str, seconds: float) -> None:
                if step:
                    bar.update(task, description=step)
                bar.advance(task, seconds)
            sweep(plan.model, plan.config, plan.shipped_text, workspace,
                  request_inputs(plan.config), load,
                  SweepSettings(plan.objective, plan.budget_s, plan.devices), result, progress)
    except ShippedConfigError as e:
        _finish(plan, info, result, console)
        raise BadInputError(f"the model does not load or serve with its own config.pbtxt: "
                            f"{e}") from e
    except KeyboardInterrupt:
        if result.measurements:
            report.print_table(result, info, console)
        raise
    finally:
        workspace.close()
    return _finish(plan, info, result, console)


def _finish(plan: Plan, info: report.RunInfo, result: SweepResult, console: Console) -> int:
    """Table, written config and report; the exit status."""
    report.print_table(result, info, console)
    chosen = winner(result, plan.objective, plan.p99_ms) if result.measurements else None
    comparison = written_path = None
    safe_files.make_folder(plan.report_dir, plan.force)
    with safe_files.folder(plan.report_dir, plan.force) as folder:
        if chosen is not None and chosen.points:
            comparison = report.compare(result, chosen, plan.objective, plan.p99_ms)
            written_path = _write_config(plan, chosen, report.header(info, chosen, comparison),
                                         folder)
            console.print(f"written: {written_path}\n  {chosen.candidate.label()}\n  "
                          f"{report.comparison_text(comparison, plan.objective)}")
        safe_files.write_at(folder, "results.json",
                            report.results_json(info, result, chosen, comparison))
        figure, note = _figure(plan, result, chosen)
        safe_files.write_at(folder, "report.md", report.markdown(
            info, result, chosen, comparison, written_path, figure, note))
    console.print(f"report: {plan.report_dir / 'report.md'}" + (f" ({note})" if note else ""))
    if chosen is None and result.measurements and result.shipped.points:
        bound = f"p99 ≤ {plan.p99_ms:g} ms" if plan.p99_ms else "the objective"
        raise BadInputError(f"no candidate met {bound} without errors; nothing written "
                            "(the points measured are above)")
    return 0


def _write_config(plan: Plan, chosen: Measurement, header: str, report_folder: int) -> Path:
    """The tuned config in the report folder (`report_folder`: its descriptor), and with
    --write in the model's folder too: the model's repository is left as it was otherwise."""
    text = header + (plan.shipped_text if chosen.stage == "shipped"
                     else space.render(plan.config, chosen.candidate))
    original = plan.model_dir / "config.pbtxt"
    safe_files.write_at(report_folder, original.name, text)
    if not plan.write:
        return plan.report_dir / original.name
    kept = original.name + ORIGINAL_SUFFIX
    with safe_files.folder(plan.model_dir, plan.force) as folder:
        # The first --write keeps the user's own file (as tune read it); a link is no backup.
        if not safe_files.is_file_at(folder, kept):
            safe_files.write_at(folder, kept, plan.shipped_text)
        safe_files.write_at(folder, original.name, text)
    return original


def _figure(plan: Plan, result: SweepResult,
            chosen: Measurement | None) -> tuple[Path | None, str]:
    try:
        from service.clients.tune import pareto
    except ImportError:
        return None, ("no PNG: matplotlib is not installed (pip install 'hetserve[tune]' "
                      "adds it)")
    series = {m.candidate.label(): [(p.rps, p.gflops_per_watt, rank.qualifies(p, plan.p99_ms))
                                    for p in m.points if p.gflops_per_watt]
              for m in result.measurements}
    sources = {s for m in result.measurements for p in m.points for s in p.sources.values()}
    if not any(series.values()):
        return None, "no PNG: no load point has watts (each needs two power samples)"
    title = f"{plan.model}: every load point measured (objective {plan.objective})"
    hollow = f"p99 over {plan.p99_ms:g} ms or errors" if plan.p99_ms else "errors"
    return pareto.draw(series, result.shipped.candidate.label(),
                      chosen.candidate.label() if chosen else None, sources, title, hollow,
                      plan.report_dir / "front.png", plan.force), ""
