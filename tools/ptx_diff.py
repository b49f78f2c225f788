"""Compare the PTX two versions of a kernel source compile to, instruction by instruction (no GPU needed).

    python tools/ptx_diff.py attention/kernels/flash_fwd_tma.cu --rev c2cc8d7 \\
        --expr "flash_fwd_tma<__nv_bfloat16,128,128,2,true,4,2>" [--expr ...] [--arch sm_90a]
    python tools/ptx_diff.py NEW.cu --old OLD.cu --expr ...

For each name expression, the count of every PTX instruction (opcode with its type suffixes) in the two builds
and the ones that differ; exit status 1 when any differs. Equal counts mean the builds differ at most in
instruction order and register names: the check for a refactor meant to leave the generated code alone. With
--rev, the source's folder (its kernel and the headers beside it) is taken from that git revision; the engine's
headers (cukernels/kernels) are the working tree's in both builds.
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from cukernels import compile as ccompile


def _old_source(new: Path, rev: str, tmp: Path) -> Path:
    """The folder of ``new`` as it was at git revision ``rev``, written under ``tmp``; the old kernel's path."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True,
                               cwd=new.parent).stdout.strip())
    folder = new.resolve().parent.relative_to(root)
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{folder.as_posix()}"], capture_output=True,
                           text=True, check=True, cwd=root).stdout.split()
    for name in names:
        blob = subprocess.run(["git", "show", f"{rev}:{(folder / name).as_posix()}"], capture_output=True,
                              check=True, cwd=root).stdout
        (tmp / name).write_bytes(blob)
    return tmp / new.name


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/ptx_diff.py", description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="the kernel source (the new version)")
    old = p.add_mutually_exclusive_group(required=True)
    old.add_argument("--rev", help="git revision of the old version (the source's folder at that revision)")
    old.add_argument("--old", type=Path, help="the old version's source file")
    p.add_argument("--expr", action="append", required=True, help="a kernel's name expression (repeatable)")
    p.add_argument("--arch", default="sm_90a", help="target architecture (default sm_90a)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old_path = args.old if args.old is not None else _old_source(args.source, args.rev, Path(tmp))
        before = ccompile.instruction_counts(old_path, args.expr, args.arch)
        after = ccompile.instruction_counts(args.source, args.expr, args.arch)
    differs = False
    for expr in args.expr:
        a, b = before[expr], after[expr]
        changed = sorted(op for op in set(a) | set(b) if a[op] != b[op])
        total_a, total_b = sum(a.values()), sum(b.values())
        print(f"{expr}: {total_a} -> {total_b} instructions, {len(changed)} opcodes with other counts")
        for op in changed:
            print(f"  {op:60s} {a[op]:6d} -> {b[op]:6d}")
        differs |= bool(changed)
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
