"""LLVM lit-style tests: every tests/filecheck/*.tile holds `// RUN: <command>`
lines and FileCheck directives. For each RUN line, `%s` becomes the file,
`tilec` the compiler (`python -m tilec`, the tilec these tests import) and
`filecheck` the FileCheck port; the pipeline runs from the repository root and
must exit 0."""
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TILEC
FILES = sorted((ROOT / "tests" / "filecheck").glob("*.tile"))
RUN = re.compile(r"^\s*//\s*RUN:\s*(.*?)\s*$")
TOOL = re.compile(r"(^|[|;&]\s*)(tilec|filecheck)(?=\s|$)")


def find_filecheck():
    beside = Path(sys.executable).parent / "filecheck"
    if beside.exists():
        return str(beside)
    return shutil.which("filecheck")


FILECHECK = find_filecheck()


def run_lines(path):
    return [m.group(1) for line in path.read_text().splitlines() if (m := RUN.match(line))]


def expand(command, path):
    tools = {"tilec": shlex.join(TILEC), "filecheck": shlex.quote(FILECHECK or "filecheck")}
    command = TOOL.sub(lambda m: m.group(1) + tools[m.group(2)], command)
    return command.replace("%s", shlex.quote(str(path.relative_to(ROOT))))


def test_there_are_filecheck_files():
    assert len(FILES) >= 10
    for path in FILES:
        assert run_lines(path), f"{path.name} has no RUN line"


@pytest.mark.skipif(FILECHECK is None, reason="the `filecheck` command (pip install filecheck) is not installed")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_filecheck(path):
    for line in run_lines(path):
        command = expand(line, path)
        # pipefail: a tilec that fails in front of filecheck fails the RUN line
        proc = subprocess.run("set -o pipefail; " + command, shell=True, executable="/bin/bash", cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (f"RUN: {line}\n$ {command}\nexit {proc.returncode}\n"
                                      f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
