"""Which of torchvision's classification models the OpenCL engine runs, as a user would find out:
each model (random weights) exported to ONNX by torch.onnx.export (opset 17, a dynamic batch
axis), loaded by the engine and compared with ONNX Runtime's CPU provider at batch 2 on the same
random images (max relative error, same top-1), with images/s of both; or the op and node the
engine refused at load. Needs the `torchvision` extra (torch, torchvision):

    pip install -e '.[cpu,torchvision]'
    python -m tools.torchvision_coverage --device opencl:cpu0 --onnx-dir /tmp/tv-onnx

Each model runs in its own process (a crash or a refusal stays that model's row); exports are
kept in --onnx-dir and reused. Results are appended to --results as JSON lines as they come, and
the table (docs/opencl.md's) is printed from them at the end, or alone with --table."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BATCH = 2
# Models whose layers fix their input size (AlexNet's and VGG's 6x6 and 7x7 adaptive pools
# export only as identities, MaxViT's and Swin's windows tile 224); the others take SMALL_SIZE
# images, which keeps a 2-core run short. ViTs are built for SMALL_SIZE (image_size), rounded
# down to whole patches.
FIXED_SIZE = {"alexnet": 224, "vgg": 224, "maxvit": 224, "swin": 224}
SMALL_SIZE = 128
TOLERANCE = 1e-3


def input_size(name: str) -> int:
    if name.startswith("vit_"):  # a whole number of patches: vit_h_14's are 14 pixels
        patch = int(name.rsplit("_", 1)[1])
        return SMALL_SIZE // patch * patch
    return next((s for prefix, s in FIXED_SIZE.items() if name.startswith(prefix)), SMALL_SIZE)


def export(name: str, path: Path) -> None:
    import torch
    import torchvision

    size = input_size(name)
    kwargs = {"image_size": size} if name.startswith("vit_") else {}
    model = torchvision.models.get_model(name, weights=None, **kwargs).eval()
    for weight in model.parameters():  # ViT's head starts at zero: every logit would be 0
        if weight.dim() > 1 and not weight.any():
            torch.nn.init.normal_(weight, std=0.02)
    # Gradients on, as in a user's script: under no_grad nn.MultiheadAttention takes its fused
    # path, which has no ONNX export.
    torch.onnx.export(model, (torch.randn(BATCH, 3, size, size),), str(path), opset_version=17,
                      input_names=["image"], output_names=["logits"], dynamo=False,
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})


def images_per_s(run, seconds: float = 1.0) -> float:
    """Batches of BATCH images run until `seconds` have passed (at least 2, after a warm-up)."""
    run()
    count, start = 0, time.perf_counter()
    while count < 2 or time.perf_counter() - start < seconds:
        run()
        count += 1
    return count * BATCH / (time.perf_counter() - start)


def check_one(name: str, onnx_dir: Path, device: str) -> dict:
    """One model's row: exported if not yet, then compared and timed."""
    import onnxruntime as ort

    from accelerators.opencl.engine import OpenCLEngine
    from accelerators.opencl.ir import UnsupportedModelError

    path = onnx_dir / f"{name}.onnx"
    if not path.exists():
        start = time.perf_counter()
        export(name, path)
        print(f"{name}: exported in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    size = input_size(name)
    x = np.random.default_rng(0).standard_normal((BATCH, 3, size, size)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = session.run(["logits"], {"image": x})[0]
    row = {"model": name, "size": size}
    try:
        engine = OpenCLEngine(path, device)
    except UnsupportedModelError as e:
        found = re.search(r"op '(\w+)'.*?node '([^']*)'", str(e)) or re.search(
            r"(\w+) node '([^']*)'", str(e))
        return row | {"status": "refused", "op": found.group(1) if found else "?",
                      "node": found.group(2) if found else "", "reason": str(e)[:300]}
    got = engine.run({"image": x}, ["logits"])["logits"]
    error = float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
    same_top1 = bool((got.argmax(1) == ref.argmax(1)).all())
    return row | {
        "status": "ok" if error <= TOLERANCE and same_top1 else "wrong",
        "max_rel_err": error, "same_top1": same_top1,
        "opencl_img_s": images_per_s(lambda: engine.run({"image": x}, ["logits"])),
        "ort_img_s": images_per_s(lambda: session.run(["logits"], {"image": x}))}


def table(rows: list[dict]) -> str:
    lines = ["| model | input | result | max rel. error | top-1 | OpenCL img/s | ORT CPU img/s |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["model"]):
        if r["status"] in ("ok", "wrong"):
            lines.append(f"| {r['model']} | {r['size']} | {r['status'].upper()} | "
                         f"{r['max_rel_err']:.1e} | {'same' if r['same_top1'] else 'differs'} | "
                         f"{r['opencl_img_s']:.2f} | {r['ort_img_s']:.2f} |")
        elif r["status"] == "refused":
            lines.append(f"| {r['model']} | {r['size']} | refused at `{r['op']}` "
                         f"({r['node']}) | | | | |")
        else:
            lines.append(f"| {r['model']} | {r.get('size', '')} | failed: {r['reason']} "
                         f"| | | | |")
    ok = sum(r["status"] == "ok" for r in rows)
    lines.append(f"\n{ok} of {len(rows)} agree; "
                 f"{sum(r['status'] == 'refused' for r in rows)} refused at load.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="opencl:cpu0", help="the engine's device spec")
    parser.add_argument("--onnx-dir", type=Path, default=Path("/tmp/torchvision-onnx"))
    parser.add_argument("--results", type=Path, default=None,
                        help="JSON lines, appended per model (default: ONNX_DIR/results.jsonl)")
    parser.add_argument("--models", default="", help="comma-separated; default: all")
    parser.add_argument("--skip-done", action="store_true", help="models already in --results")
    parser.add_argument("--table", action="store_true", help="print the table of --results")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the per-model child process
    args = parser.parse_args()
    results = args.results or args.onnx_dir / "results.jsonl"
    device = args.device.removeprefix("opencl:")
    if args.one:
        print(json.dumps(check_one(args.one, args.onnx_dir, device)))
        return
    if not args.table:
        import torchvision

        names = args.models.split(",") if args.models else torchvision.models.list_models(
            module=torchvision.models)
        args.onnx_dir.mkdir(parents=True, exist_ok=True)
        done = {json.loads(line)["model"] for line in results.read_text().splitlines()} \
            if args.skip_done and results.exists() else set()
        for name in [n for n in names if n not in done]:
            child = subprocess.run(
                [sys.executable, __file__, "--one", name, "--onnx-dir", str(args.onnx_dir),
                 "--device", device], capture_output=True, text=True)
            lines = child.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if child.returncode == 0 and lines else {
                "model": name, "status": "failed",
                "reason": (child.stderr.strip().splitlines() or ["?"])[-1][:200]}
            print(json.dumps(row), flush=True)
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
    rows = {}
    for line in results.read_text().splitlines():  # the latest row of each model
        row = json.loads(line)
        rows[row["model"]] = row
    print(table(list(rows.values())))


if __name__ == "__main__":
    main()
