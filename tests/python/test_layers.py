"""The layer rule of docs/design.md, checked: no file under src/ includes a
header of a layer it may not use; and the house rule beside it, that no
PERFTRAIN_* switch is read from the environment there (a choice is an
option or a config key, passed down from cli/).

The rule has one place, src/CMakeLists.txt: `perftrain_layer(NAME DEPS...)`
names each layer (a folder under src/) and the layers it links; a layer may
use its own folder, what it links and what those link in turn. The program
(`cli/`) is the executable that links perftrain_train; the Python module
(`python/csrc/`, the layer `python`, above train) is the target perftrain_python
of python/CMakeLists.txt, and may use what it links there. Third-party and system
headers (<...>) are not ours and are not checked, except that the kernels
include no torch header (they are CUDA C++ on raw pointers).

Run with pytest, or without it:  python tests/python/test_layers.py [ROOT]
(ROOT: the source tree, default this checkout; a failure lists every bad
include as file:line and exits 1).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
TORCH_HEADERS = ("torch/", "ATen/", "c10/", "caffe2/")


def _strip_comments(text):
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def read_links(root):
    """{layer: set of layers it links directly}, from src/CMakeLists.txt."""
    with open(os.path.join(root, "src", "CMakeLists.txt")) as f:
        text = _strip_comments(f.read())
    links = {}
    for name, deps in re.findall(r"perftrain_layer\(\s*(\w+)([^)]*)\)", text):
        links[name] = set(re.findall(r"\bperftrain_(\w+)\b", deps))
    # The program: src/cli/*.cpp linked into the perftrain executable.
    program = re.search(r"target_link_libraries\(\s*perftrain\s+(?:PRIVATE|PUBLIC)?([^)]*)\)", text)
    if program:
        links["cli"] = set(re.findall(r"\bperftrain_(\w+)\b", program.group(1)))
    # The Python module: python/csrc/*.cpp linked into perftrain._C.
    with open(os.path.join(root, "python", "CMakeLists.txt")) as f:
        module = re.search(r"target_link_libraries\(\s*perftrain_python\s+(?:PRIVATE|PUBLIC)?([^)]*)\)",
                           _strip_comments(f.read()))
    if module:
        links["python"] = set(re.findall(r"\bperftrain_(\w+)\b", module.group(1)))
    for deps in links.values():
        deps.discard("thirdparty")  # third-party code, not a layer of ours
    return links


def allowed_layers(links):
    """{layer: every layer it may include from}: itself and the links' closure."""
    allowed = {}
    for layer in links:
        seen, todo = {layer}, [layer]
        while todo:
            for dep in links.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        allowed[layer] = seen
    return allowed


def source_files(root):
    """(rel, path): rel is LAYER/... (the src/ folders, and python/csrc/ as the layer python)."""
    src = os.path.join(root, "src")
    for folder, _, files in os.walk(src):
        for name in sorted(files):
            if name.endswith(SOURCES):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, src).replace(os.sep, "/"), path
    csrc = os.path.join(root, "python", "csrc")
    if os.path.isdir(csrc):
        for name in sorted(os.listdir(csrc)):
            if name.endswith(SOURCES):
                yield "python/" + name, os.path.join(csrc, name)


def shown(rel):
    """The file's path in the checkout."""
    return "python/csrc/" + rel.split("/", 1)[1] if rel.startswith("python/") else "src/" + rel


def violations(root):
    """Every include that breaks the rule, as 'src/file:line: text'."""
    links = read_links(root)
    allowed = allowed_layers(links)
    bad = []
    for rel, path in source_files(root):
        layer = rel.split("/", 1)[0]
        if "/" not in rel:
            continue  # files beside the layer folders (CMakeLists.txt only today)
        if layer not in allowed:
            bad.append(f"{shown(rel)}: the folder {layer}/ is no layer of src/CMakeLists.txt")
            continue
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = re.match(r'\s*#\s*include\s*([<"])([^">]+)[">]', line)
                if not m:
                    continue
                header = m.group(2)
                where = f"{shown(rel)}:{number}: {line.strip()}"
                if m.group(1) == "<":
                    if layer == "kernels" and header.startswith(TORCH_HEADERS):
                        bad.append(f"{where}  (kernels include no torch header)")
                    continue
                target = header.split("/", 1)[0] if "/" in header else None
                if target is None or target not in links:
                    continue  # a header beside the file, or not one of our layers
                if target not in allowed[layer]:
                    may = ", ".join(sorted(allowed[layer] - {layer})) or "no other layer"
                    bad.append(f"{where}  ({layer} may use {may})")
    return bad


ENV_READ = re.compile(r'\b(?:secure_)?getenv\s*\(\s*"(PERFTRAIN_\w*)"')


def environment_switches(root):
    """Every read of a PERFTRAIN_* variable from the environment, as 'src/file:line: text'."""
    found = []
    for rel, path in source_files(root):
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                if ENV_READ.search(line):
                    found.append(f"{shown(rel)}:{number}: {line.strip()}")
    return found


def test_the_environment_check_finds_a_switch():
    assert ENV_READ.search('  if (const char* p = std::getenv("PERFTRAIN_PYTHON"); p)')
    assert ENV_READ.search('secure_getenv( "PERFTRAIN_X")')
    assert not ENV_READ.search('std::getenv("XDG_CACHE_HOME")')
    assert not ENV_READ.search('// PERFTRAIN_PYTHON, the build\'s')


def test_no_perftrain_switch_is_read_from_the_environment():
    found = environment_switches(ROOT)
    assert not found, "PERFTRAIN_* read from the environment (make it an option or a config key):\n" + "\n".join(found)


def test_the_rule_is_read_from_cmake():
    links = read_links(ROOT)
    allowed = allowed_layers(links)
    for layer in ("base", "compat", "io", "data", "diffusion", "kernels", "ops", "nn", "models", "observe",
                  "distributed", "train", "cli", "python"):
        assert layer in links, layer
    assert allowed["base"] == {"base"}
    assert "kernels" in allowed["ops"] and "ops" not in allowed["kernels"]
    assert "models" in allowed["train"] and "train" not in allowed["models"]
    assert "train" in allowed["cli"] and "cli" not in allowed["train"]
    assert "models" not in allowed["observe"]
    assert "ops" in allowed["python"] and not any("python" in allowed[layer] for layer in links if layer != "python")


def test_no_file_includes_a_layer_above_its_own():
    bad = violations(ROOT)
    assert not bad, "includes that break the layer rule (src/CMakeLists.txt):\n" + "\n".join(bad)


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else ROOT
    if root == ROOT:
        test_the_rule_is_read_from_cmake()
        test_the_environment_check_finds_a_switch()
    found = violations(root)
    switches = environment_switches(root)
    for line in found + switches:
        print(line)
    files = sum(1 for _ in source_files(root))
    print(f"{files} files under src/ and python/csrc/: {len(found)} includes break the layer rule, "
          f"{len(switches)} read a PERFTRAIN_* switch from the environment")
    sys.exit(1 if found or switches else 0)
