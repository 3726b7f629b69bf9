"""Imports run one way. Every `import` / `from` statement of pipeline/ and vl_models/ (those
inside functions too, relative ones resolved) is an edge, and no edge may point up:

    1. shared basics     pipeline.errors, pipeline.io, pipeline.log, pipeline.config, pipeline.registry
    2. pipeline          the rest of it
    3. vl_models         the rest of it
    4. the demo          vl_models.demo, vl_models.serve (they orchestrate both packages)

Within a layer, a few packages stay below others (`BELOW`): the model data and models never
import the tasks, the trainer or evaluation; the model families, the trainer and evaluation
never import transfer (it builds on them); evaluation never imports the trainer; the library's
detector knows no data set; the shard distributor knows neither download nor extract; the
item-folder format (`pipeline.items`) knows neither of the formats built on it; asking a model
(`vl_models.predict`) builds on training, evaluation and transfer, none of which imports it;
nothing imports the command line (`vl_models.cli`). And docs/layout.md lists every module, and
the test files the code and the docs cite exist."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "vl_models")
BASICS = ("pipeline.errors", "pipeline.io", "pipeline.log", "pipeline.config", "pipeline.registry")
LAYERS = (
    (4, "the demo and the web page", ("vl_models.demo", "vl_models.serve")),
    (1, "shared basics", BASICS),
    (2, "pipeline", ("pipeline",)),
    (3, "vl_models", ("vl_models",)),
)
# (importer, imported): no module under the first prefix imports one under the second.
BELOW = [
    (low, high)
    for low in ("vl_models.data", "vl_models.models")
    for high in ("vl_models.tasks", "vl_models.train", "vl_models.eval", "vl_models.transfer")
]
BELOW += [(low, "vl_models.transfer") for low in ("vl_models.families", "vl_models.train", "vl_models.eval")]
BELOW += [("pipeline.detect", "pipeline.synthetic")]
# The distributor runs download and extract alike and knows neither; the item-folder format
# serves mixtures and task datasets and knows neither; sources read files for both.
BELOW += [("pipeline.distribute", p) for p in ("pipeline.download", "pipeline.detect")]
BELOW += [("pipeline.failures", p) for p in ("pipeline.download", "pipeline.detect", "pipeline.distribute")]
BELOW += [("pipeline.items", p) for p in ("pipeline.mixture", "pipeline.task_data", "pipeline.store")]
BELOW += [("pipeline.sources", p) for p in ("pipeline.mixture", "pipeline.items", "pipeline.datasets")]
# Evaluation and the trainer: the trainer evaluates, evaluation never imports the trainer.
BELOW += [("vl_models.eval", "vl_models.train")]
# Asking a model builds on the trainer, evaluation and transfer, and none of them asks; the
# command line is the top of vltrain: nothing below it imports it (the commands' flags and
# configs, progress bars and the predict command are modules of their own).
LOWER = ("data", "models", "tasks", "families", "train", "eval", "transfer")
BELOW += [(f"vl_models.{low}", "vl_models.predict") for low in LOWER]
BELOW += [(f"vl_models.{low}", "vl_models.cli") for low in (*LOWER, "predict", "flags", "progress", "config")]


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer(module: str) -> tuple[int, str] | None:
    """(rank, name) of one of our modules; None for everything else (stdlib, third party)."""
    for rank, name, prefixes in LAYERS:
        if any(within(module, p) for p in prefixes):
            return rank, name
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, relative ones made absolute; `from P import
    name` counts as importing P.name when that is a module of ours, else P."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if is_module(sub) else base))
    return found


def edges() -> list[tuple[str, int, str, str]]:
    """(file, line, importer, imported) for every import between our modules."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            importer = module_name(path)
            out += [
                (str(path.relative_to(ROOT)), line, importer, imported)
                for line, imported in imports(path)
                if layer(imported) and imported != importer
            ]
    return out


def test_the_walk_sees_the_edges_it_should():
    found = edges()
    assert len({importer for _, _, importer, _ in found}) > 50  # every module of both packages
    pairs = {(importer, imported) for _, _, importer, imported in found}
    assert ("vl_models.demo.stages", "pipeline.synthetic") in pairs  # a function-level import
    assert ("vl_models.demo.families", "vl_models.train.trainer") in pairs
    assert ("pipeline.cli", "pipeline.errors") in pairs
    assert ("pipeline.synthetic.world", "pipeline.synthetic.scenes") in pairs


def test_no_import_points_to_a_higher_layer():
    upward = [
        f"{file}:{line}: {importer} ({layer(importer)[1]}) imports {imported} ({layer(imported)[1]})"
        for file, line, importer, imported in edges()
        if layer(imported)[0] > layer(importer)[0]
    ]
    assert upward == [], "imports must run shared basics <- pipeline <- vl_models <- demo:\n" + "\n".join(upward)


@pytest.mark.parametrize("low, high", BELOW, ids=lambda v: v)
def test_lower_packages_do_not_import_higher_ones(low, high):
    upward = [
        f"{file}:{line}: {importer} imports {imported}"
        for file, line, importer, imported in edges()
        if within(importer, low) and within(imported, high)
    ]
    assert upward == [], f"{low} must not import {high}:\n" + "\n".join(upward)


def test_moved_modules_stay_moved():
    """The demo lives above both packages; the shapes world is `pipeline.synthetic`, split
    by concern (no second copy, no compatibility module); its detector recipe is workflow code."""
    assert not is_module("pipeline.demo") and is_module("vl_models.demo")
    for package in ("vl_models.demo", "vl_models.predict"):  # packages of one concern per module
        assert (ROOT.joinpath(*package.split(".")) / "__init__.py").is_file()
        assert not ROOT.joinpath(*package.split(".")).with_suffix(".py").exists()
    assert not hasattr(__import__("pipeline.records").records, "pad_regions")  # the batch: pipeline.store.buffer
    assert not is_module("pipeline.datasets.shapes") and is_module("pipeline.synthetic.world")
    assert not is_module("pipeline.mixture.answers") and is_module("pipeline.items.answers")
    assert not is_module("pipeline.download.failures") and is_module("pipeline.failures")
    assert not is_module("vl_models.train.distributed") and is_module("vl_models.distributed")
    assert (ROOT / "workflows" / "shapes" / "shapes_detector.py").is_file()


def _run_python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_importing_the_vlprep_cli_imports_no_vl_models():
    code = "import sys, pipeline.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'vl_models'))"
    assert _run_python(code) == "[]"


def test_the_demo_plugin_attaches_without_torch():
    """`vlprep` attaches its plugins at every start: the demo's registration stays light."""
    code = (
        "import sys, pipeline.cli as c; c.load_plugins(); c.load_plugins(); "
        "names = [x.name for x in c.app.registered_commands]; "
        "print(names.count('demo'), 'torch' in sys.modules)"
    )
    assert _run_python(code) == "1 False"


def test_the_layout_doc_lists_every_module():
    """docs/layout.md's "Every module" names each module of both packages, folder by folder,
    and no module that is not there."""
    doc = (ROOT / "docs" / "layout.md").read_text().split("## Every module", 1)[1]
    listed, folder = set(), None
    for line in doc.splitlines():
        if line.startswith("**`") and line.endswith("/`**"):
            folder = line[3:-4]
        elif line.startswith("| `") and folder:
            listed.add(f"{folder}/{line.split('`')[1]}")
    present = {
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert sorted(present - listed) == [] and sorted(listed - present) == []


def test_cited_test_files_exist():
    """Every test file the code, the benches and the docs cite (``tests/...py``) is there."""
    import re

    sources = [p for d in (*PACKAGES, "bench", "docs") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md")]
    cited = {
        (str(path.relative_to(ROOT)), name)
        for path in [*sources, ROOT / "README.md"]
        for name in re.findall(r"tests/[\w/]+\.py", path.read_text())
    }
    assert sorted((where, name) for where, name in cited if not (ROOT / name).is_file()) == []
