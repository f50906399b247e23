"""The README's commands, run as a reader would type them (issue 55): every fenced `sh` block's
commands and every `python` block, in a scratch folder laid out as the repository root
(`build/` the build under test, `examples/` and `scripts/` the repository's), so that the front
door stays true.

A block may be preceded by HTML comments that say how it is tested (a reader does not see them):
  <!-- readme-test: ci (WHY) -->        .ci/run runs the block's commands itself (checked here:
                                        each of them is a line of .ci/run or of a script it runs)
  <!-- readme-test: skip (WHY) -->      not run here, for the reason given (it must give one)
  <!-- readme-test: setup CMD -->       a shell command run first, in the scratch folder
  <!-- readme-test: append "PREFIX" ARGS -->  ARGS added to each command that contains PREFIX
                                        (tiny settings: the README's text says so)
  <!-- readme-test: expect PATH -->     a file the block must have written
  <!-- readme-test: python -->          a python block run with this interpreter
Every block is one of these: a block without a directive is an `sh` block and is run.
"""
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*(\w+)\s*(.*?)\s*-->")


def blocks():
    """(line, language, code, directives) for each fenced block of the README."""
    out, pending = [], []
    lines = open(README).read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = DIRECTIVE.match(line.strip())
        if m:
            pending.append((m.group(1), m.group(2)))
        elif line.startswith("```") and len(line) > 3:
            lang, start = line[3:].strip(), i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append((start, lang, "\n".join(lines[start:j]), pending))
            pending, i = [], j
        elif line.strip():
            pending = []  # directives belong to the block right below them
        i += 1
    return out


def commands(code):
    """The shell commands of an sh block: continuation lines joined, comments left out."""
    cmds, cur = [], ""
    for line in code.split("\n"):
        if not cur and (not line.strip() or line.strip().startswith("#")):
            continue
        cur += line.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        cmds.append(cur.strip())
        cur = ""
    return cmds


def test_the_readme_has_the_front_doors_blocks():
    bs = blocks()
    langs = [b[1] for b in bs]
    assert len(open(README).read().split("\n")) <= 200, "README.md is over 200 lines (issue 55)"
    assert langs.count("python") == 1 and "sh" in langs, langs
    for line, lang, code, directives in bs:
        assert lang in ("sh", "python"), f"README.md:{line}: a ```{lang} block (sh or python, to be tested)"
        for kind, arg in directives:
            assert kind in ("ci", "skip", "setup", "append", "expect", "python"), f"README.md:{line}: {kind}"
            if kind in ("ci", "skip"):
                assert arg.startswith("(") and len(arg) > 5, f"README.md:{line}: {kind} needs a reason in ()"
    # Every documentation page the README links to exists.
    for target in re.findall(r"\]\((docs/[^)#]+)", open(README).read()):
        assert os.path.exists(os.path.join(REPO, target)), target


def test_ci_runs_the_blocks_it_is_said_to_run():
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    ran = 0
    for line, lang, code, directives in blocks():
        if any(k == "ci" for k, _ in directives):
            for cmd in commands(code):
                assert re.search(r"^\s*" + re.escape(cmd) + r"\s*$", ci, re.M), \
                    f"README.md:{line}: `{cmd}` is marked as run by CI, and .ci/run does not run it"
                ran += 1
    assert ran >= 2


@pytest.fixture
def root(tmp_path, medfast_binary):
    """A scratch folder laid out as the repository root."""
    build = os.path.dirname(os.path.abspath(medfast_binary))
    os.symlink(build, tmp_path / "build")
    for name in ("examples", "scripts"):
        os.symlink(os.path.join(REPO, name), tmp_path / name)
    return tmp_path


def run_block(root, line, lang, code, directives):
    env = dict(os.environ, MEDFAST_THREADS="2", MEDFAST_PROGRESS="off")
    appends = []
    for kind, arg in directives:
        if kind == "setup":
            subprocess.run(arg, shell=True, cwd=root, env=env, check=True, timeout=300)
        elif kind == "append":
            prefix, rest = shlex.split(arg)[0], shlex.split(arg)[1:]
            appends.append((prefix, rest))
    if lang == "python":
        script = root / "readme_block.py"
        script.write_text(code + "\n")
        r = subprocess.run([sys.executable, str(script)], cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"README.md:{line}: the python block failed:\n{r.stdout}\n{r.stderr}"
        return
    for cmd in commands(code):
        args = shlex.split(cmd)
        for prefix, rest in appends:
            if prefix in cmd:
                args += rest
        r = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"README.md:{line}: `{shlex.join(args)}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    for kind, arg in directives:
        if kind == "expect":
            assert (root / arg).exists(), f"README.md:{line}: the block wrote no {arg}"


RUNNABLE = [b for b in blocks() if not any(k in ("ci", "skip") for k, _ in b[3])]


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"line{b[0]}" for b in RUNNABLE])
def test_the_readmes_commands_run(root, block):
    line, lang, code, directives = block
    run_block(root, line, lang, code, directives)
    if any(k == "expect" and a.endswith(".nii.gz") for k, a in directives):
        nib = pytest.importorskip("nibabel")
        for kind, arg in directives:
            if kind == "expect" and arg.endswith(".nii.gz"):
                assert len(nib.load(str(root / arg)).shape) >= 3
