"""deploy/docker/Dockerfile against what deploy/k8s's manifests expect of
the images they name, without Docker (CI has none): the Dockerfile is read
by BuildKit's own parser (PyPI's `dockerfile`), then

- every image a manifest names is one its header's `docker build` lines
  build, from a stage the Dockerfile has;
- every file a container's command names (python3 /app/train.py) is copied
  into that image by its stages;
- every COPY from the build context names a file or directory of the
  repository;
- every RUN is valid shell (bash -n);
- every package apt-get installs exists in Debian 12, as this Debian 12
  host's apt-cache knows them (said and left out where it has no lists).

Usage: images_check.py REPO_ROOT. Exit 0 when all hold, 1 naming each that
does not.
"""

import glob
import re
import subprocess
import sys
from pathlib import Path

import dockerfile
import yaml

BUILD_LINE = re.compile(r"docker build .*--target (\S+) -t (\S+) \.")


def stages(commands):
    """{stage name: (parent stage or None, [commands of the stage])}"""
    out, name = {}, None
    for c in commands:
        if c.cmd == "FROM":
            base, _, name = c.value
            out[name] = (base if base in out else None, [])
        elif name is not None:
            out[name][1].append(c)
    return out


def lineage(all_stages, name):
    while name is not None:
        parent, commands = all_stages[name]
        yield name, commands
        name = parent


def manifest_containers(k8s_dir):
    """(manifest, image, command) of every container in the manifests."""
    def walk(node, where):
        if isinstance(node, dict):
            if "image" in node and "command" in node:
                yield where, node["image"], node["command"] + node.get("args", [])
            for value in node.values():
                yield from walk(value, where)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value, where)
    for path in sorted(Path(k8s_dir).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            yield from walk(doc, path.name)


def apt_packages(run):
    """The packages of each `apt-get install` in a RUN."""
    for part in re.split(r"&&|;|\|\|", run):
        words = part.split()
        if "apt-get" in words and "install" in words:
            rest = words[words.index("install") + 1:]
            yield from (w for w in rest if not w.startswith("-"))


def main():
    root = Path(sys.argv[1]).resolve()
    path = root / "deploy" / "docker" / "Dockerfile"
    problems = []
    commands = dockerfile.parse_file(str(path))
    all_stages = stages(commands)
    header = path.read_text().split("\nFROM", 1)[0]
    targets = {tag: target for target, tag in BUILD_LINE.findall(header)}
    for tag, target in targets.items():
        if target not in all_stages:
            problems.append(f"the header builds {tag} from stage '{target}', which is not there")

    checked = 0
    for manifest, image, command in manifest_containers(root / "deploy" / "k8s"):
        target = targets.get(image)
        if target is None:
            problems.append(f"{manifest}: image {image} is built by no line of the header")
            continue
        copied = {c.value[-1] for _, cs in lineage(all_stages, target) for c in cs
                  if c.cmd == "COPY"}
        for word in command:
            if word.startswith("/app/") and word not in copied:
                problems.append(f"{manifest}: {image} runs {word}, which no stage of "
                                f"'{target}' copies in")
        checked += 1

    for c in commands:
        if c.cmd == "COPY" and not any(f.startswith("--from=") for f in c.flags):
            for source in c.value[:-1]:
                if not glob.glob(str(root / source)):
                    problems.append(f"line {c.start_line}: COPY {source}: no such file here")
        if c.cmd == "RUN":
            shell = subprocess.run(["bash", "-n", "-c", c.value[0]], capture_output=True,
                                   text=True)
            if shell.returncode != 0:
                problems.append(f"line {c.start_line}: RUN is not valid shell: {shell.stderr}")

    packages = sorted({p for c in commands if c.cmd == "RUN" for p in apt_packages(c.value[0])})
    if not glob.glob("/var/lib/apt/lists/*_Packages*"):
        print(f"images: the {len(packages)} apt packages not checked: this host has no apt "
              "package lists (apt-get update never ran)")
    else:
        for p in packages:
            found = subprocess.run(["apt-cache", "show", "--no-all-versions", p],
                                   capture_output=True)
            if found.returncode != 0 or not found.stdout:
                problems.append(f"apt package {p}: not in this Debian's package lists")
    for p in problems:
        print(f"images: FAIL: {p}")
    if not problems:
        print(f"images: {len(targets)} images, {checked} containers of the manifests, "
              f"{len(packages)} apt packages: the Dockerfile has what they need")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
