"""The SASS of a kernel instance, compiled the way the engine compiles it (NVRTC, no GPU needed), through NVIDIA's
``nvdisasm`` (on PATH, in $NVDISASM, or from the ``nvidia-cuda-nvdisasm`` wheel: ``pip install 'cukernels[sass]'``).

    python tools/sass.py attention/kernels/flash_fwd_tma.cu --expr "flash_fwd_tma<__nv_bfloat16,64,128,2,false,0,2>"
    python tools/sass.py SRC --expr E --at 0x9c30,0x6030        # the instructions at these offsets
    python tools/sass.py SRC --expr E --count                   # opcode counts only
    python tools/sass.py SRC --expr E --save-cubin DIR          # on a device: that machine's NVRTC build, to read here
    python tools/sass.py --cubin DIR/E.cubin --at 0x9c30        # a saved build
    python tools/sass.py SRC --expr E --loops                   # each loop (a back edge): size, opcode counts

Offsets are what compute-sanitizer and ncu report (``kernel+0x9c30``). They belong to the build that ran: a device
whose NVRTC differs from this machine's compiles other code, so map a device's report through ``--save-cubin`` run
there and ``--cubin`` here (docs/perf/attention.md, backward v5.2).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cukernels import compile as ccompile  # noqa: E402

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*\.(L_x_\d+):")
_BRANCH = re.compile(r"BRA.*`\(\.(L_x_\d+)\)")


def nvdisasm() -> str | None:
    """The nvdisasm to use: $NVDISASM, PATH, or the nvidia-cuda-nvdisasm wheel's; None when there is none."""
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    found = shutil.which("nvdisasm")
    if found:
        return found
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for cand in sorted(Path(base, "nvidia").glob("*/bin/nvdisasm")):
            return str(cand)
    return None


def _listing(data: bytes, tool: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data)
        f.flush()
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout


def disassemble(data: bytes, tool: str) -> list[tuple[int, str]]:
    """(offset, instruction) of every instruction in a single-kernel cubin."""
    return [(int(m.group(1), 16), m.group(2)) for m in _LINE.finditer(_listing(data, tool))]


def loops(data: bytes, tool: str) -> list[list[str]]:
    """The instructions of every loop of a single-kernel cubin, in code order: for each branch back to a label at
    or before it, the instructions from that label to the branch (nested loops appear once each)."""
    labels, instrs = {}, []
    for line in _listing(data, tool).splitlines():
        if m := _LABEL.match(line):
            labels[m.group(1)] = len(instrs)
        elif m := _LINE.search(line):
            instrs.append(m.group(2))
    found = []
    for i, instr in enumerate(instrs):
        if (m := _BRANCH.search(instr)) and m.group(1) in labels and labels[m.group(1)] <= i:
            found.append(instrs[labels[m.group(1)]:i + 1])
    return found


def register_moves(instrs: list[str]) -> int:
    """Plain register moves (MOV, IMAD.MOV: what ptxas emits to copy or zero registers) among ``instrs``."""
    return sum(opcode(i) == "MOV" or " IMAD.MOV" in f" {i}" for i in instrs)


def opcode(instr: str) -> str:
    """``@!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, ...`` -> ``SYNCS``."""
    words = instr.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/sass.py", description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, nargs="?", help="the kernel source")
    p.add_argument("--expr", help="the kernel's name expression")
    p.add_argument("--arch", default="sm_90a", help="target architecture (default sm_90a)")
    p.add_argument("--cubin", type=Path, help="disassemble this cubin instead of compiling")
    p.add_argument("--save-cubin", type=Path, metavar="DIR", help="write the cubin into DIR and stop")
    p.add_argument("--at", help="comma-separated offsets (hex, as sanitizer reports print them): those instructions")
    p.add_argument("--count", action="store_true", help="opcode counts instead of the listing")
    p.add_argument("--loops", action="store_true", help="each loop's size, register moves and opcode counts")
    args = p.parse_args(argv)
    if args.cubin is not None:
        data = args.cubin.read_bytes()
    else:
        if args.source is None or args.expr is None:
            p.error("give a source and --expr, or --cubin")
        data = ccompile.cubin(args.source, args.expr, args.arch)
        if args.save_cubin is not None:
            args.save_cubin.mkdir(parents=True, exist_ok=True)
            out = args.save_cubin / (re.sub(r"[^A-Za-z0-9_.,-]+", "_", args.expr) + ".cubin")
            out.write_bytes(data)
            print(out)
            return 0
    tool = nvdisasm()
    if tool is None:
        print("no nvdisasm: put it on PATH, set NVDISASM, or pip install nvidia-cuda-nvdisasm", file=sys.stderr)
        return 2
    if args.loops:
        for n, body in enumerate(loops(data, tool)):
            counts = collections.Counter(opcode(i) for i in body)
            print(f"loop {n}: {len(body)} instructions, {register_moves(body)} register moves; "
                  + ", ".join(f"{op} {k}" for op, k in counts.most_common(8)))
        return 0
    listing = disassemble(data, tool)
    if args.at:
        wanted = {int(x, 16) for x in args.at.split(",")}
        for off, instr in listing:
            if off in wanted:
                print(f"0x{off:04x}  {instr}")
        return 0
    if args.count:
        counts = collections.Counter(opcode(i) for _, i in listing)
        print(f"{len(listing)} instructions")
        for op, n in counts.most_common():
            print(f"  {op:12s} {n:6d}")
        return 0
    for off, instr in listing:
        print(f"0x{off:04x}  {instr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
