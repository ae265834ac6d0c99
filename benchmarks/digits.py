"""Accuracy with real data and real trained weights, without downloading anything.

scikit-learn ships 1,797 real 8x8 handwritten digits. This writes them as an ImageNet-style validation
folder (PNG files and a `FILE CLASS` labels file) for the held-out split, trains a zoo classifier on the
training split through the harness's own preprocessing (so evaluation sees what training saw), saves its
state dict, and, run as a script, evaluates it on every backend at fp32/bf16/int8 (and fp32 in each fast-math mode
asked, `--fpmath-modes strict,bf16`) and prints the report's accuracy-and-speed table:

    python3 benchmarks/digits.py --output results/digits --backends all --precisions fp32,bf16,int8
    python3 benchmarks/digits.py --output results/digits-fpmath --backends eager,openvino --precisions fp32 \
        --fpmath-modes strict,bf16
"""

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEST_SHARE = 0.2
SEED = 0


def split():
    """(train, held-out) lists of (8x8 uint8 image, label), the same split every time."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images * (255 / 16)).round().astype(np.uint8)     # 0..16 grey levels -> 0..255
    tr_x, te_x, tr_y, te_y = train_test_split(images, digits.target, test_size=TEST_SHARE, random_state=SEED,
                                              stratify=digits.target)
    return list(zip(tr_x, tr_y, strict=True)), list(zip(te_x, te_y, strict=True))


def write_folder(samples, folder: Path) -> Path:
    """`samples` as PNG files in `folder` plus `val_map.txt` (`digit_00001.png 7` per line); the labels path."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (image, label) in enumerate(samples, 1):
        name = f"digit_{i:05d}.png"
        Image.fromarray(image, mode="L").save(folder / name)
        lines.append(f"{name} {int(label)}")
    labels = folder / "val_map.txt"
    labels.write_text("\n".join(lines) + "\n")
    return labels


def train(samples, model: str = "resnet_18", input_size: int = 32, epochs: int = 6, out: Path | None = None):
    """A zoo classifier trained on `samples` (its 1000-way head, only the ten digit classes used), with the
    harness's preprocessing; saved as a state dict at `out` when given. Returns the module."""
    import torch
    from PIL import Image

    from aio_examples.models import get_model

    torch.manual_seed(SEED)
    spec = get_model(model)
    shape = spec.shape(input_size=input_size)
    module = spec.build(shape=shape).train()
    transform = spec.preprocess(shape)
    x = torch.stack([transform(Image.fromarray(img, mode="L")) for img, _ in samples])
    y = torch.tensor([int(label) for _, label in samples])
    optimiser = torch.optim.Adam(module.parameters(), lr=2e-3)
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(64):
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(module(x[idx]), y[idx]).backward()
            optimiser.step()
    module.eval()
    if out is not None:
        torch.save(module.state_dict(), out)
    return module


def prepare(folder: Path, model: str = "resnet_18", input_size: int = 32) -> tuple[Path, Path, Path]:
    """(image folder, labels file, weights file) of held-out digits and a classifier trained on the rest."""
    train_set, held_out = split()
    images = folder / "val"
    labels = write_folder(held_out, images)
    weights = folder / f"{model}_digits.pth"
    train(train_set, model, input_size, out=weights)
    return images, labels, weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="results/digits")
    parser.add_argument("--model", default="resnet_18")
    parser.add_argument("--input-size", type=int, default=32)
    parser.add_argument("--backends", default="all")
    parser.add_argument("--precisions", default="fp32,bf16,int8")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--fpmath-modes", default="strict", help="fp32's fast-math modes, as run --fpmath-mode")
    parser.add_argument("--timeout", default="60", help="measured seconds per configuration, as run --timeout")
    args = parser.parse_args()
    out = Path(args.output)
    images, labels, weights = prepare(out / "data", args.model, args.input_size)
    run = [sys.executable, "-m", "aio_examples", "run", args.model, "--dataset", f"imagenet:{images}",
           "--labels", str(labels), "--weights", str(weights), "--input-size", str(args.input_size),
           "--backend", args.backends, "-p", args.precisions, "--fpmath-mode", args.fpmath_modes, "-t", args.threads,
           "-b", "8", "--timeout", args.timeout,
           "--output", str(out / "results")]
    subprocess.run(run, check=True)
    report = [sys.executable, "-m", "aio_examples", "report", str(out / "results"), "--output", str(out / "report")]
    subprocess.run(report, check=True)
    import pandas as pd

    table = pd.read_csv(out / "report" / "summary.csv")
    columns = ["backend", "precision", "fpmath", "status", "top_1", "top_1_vs_eager_fp32", "speedup_vs_eager_fp32",
               "median_ms"]
    print(table[columns].sort_values(["precision", "fpmath", "backend"]).to_markdown(index=False, floatfmt=".2f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
