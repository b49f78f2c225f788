"""``python -m cukernels``: the live device, its limits and the matched profile; ``--profile NAME`` with no GPU."""
from __future__ import annotations

import argparse
import sys

from tabulate import tabulate

from . import cli, device


def _rows(spec: device.DeviceSpec) -> list[tuple[str, str, str]]:
    rows = [
        ("name", spec.name, "live" if spec.source == "live" else "profile"),
        ("profile", spec.key or "(none matched)", ""),
        ("compute capability", "%d.%d" % spec.compute_capability, ""),
        ("compile arch", spec.arch, "sm_90a on Hopper: wgmma, setmaxnreg"),
    ]
    for key, value in spec.limits().items():
        src = "cudaDeviceGetAttribute" if spec.source == "live" else spec.sources.get(key, "")
        rows.append((key, f"{value:,}", src))
    if spec.peaks is not None:
        for key, value in vars(spec.peaks).items():
            rows.append((key, f"{value:g}", spec.sources.get(key, "")))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cukernels", description=__doc__)
    parser.add_argument("--profile", help="show a profile with no GPU: any case or a unique prefix of "
                                          f"{', '.join(device.profile_names())}")
    parser.add_argument("--list", action="store_true", help="list the known profiles")
    parser.add_argument("--copy", action="store_true",
                        help="also measure the device copy bandwidth (1 GiB, engine-built kernel, the one timer)")
    args = parser.parse_args(argv)

    if args.list:
        print(tabulate([(s.key, s.name, s.arch, f"{s.smem_per_block_optin:,}") for s in device.all_profiles()],
                       headers=["profile", "name", "arch", "smem/block opt-in"], tablefmt="github"))
        return cli.EXIT_OK
    if args.profile:
        try:
            spec = cli.profile_spec(args.profile)
        except cli.UsageError as exc:
            return cli.usage_error(parser.prog, exc)
        print(tabulate(_rows(spec), headers=["limit", "value", "source"], tablefmt="github"))
        return cli.EXIT_OK
    if not device.gpu_available():
        return cli.no_gpu(parser.prog, "`python -m cukernels --profile NAME` shows a profile's limits and their "
                                       f"sources ({', '.join(device.profile_names())}).")
    spec = device.current()
    print(tabulate(_rows(spec), headers=["limit", "value", "source"], tablefmt="github"))
    info = device.nvml_info()
    sample = device.nvml_sample()
    print()
    print(tabulate(sorted({**info, **sample}.items()), headers=["NVML", "value"], tablefmt="github"))
    if spec.key is None:
        print("\nNo profile matches this GPU's name: peaks are unknown, limits are the live ones.")
    if args.copy:
        from . import bandwidth

        result = bandwidth.measure_copy(1 << 30)
        status = "correct" if result.correct else "WRONG"
        print(f"\ncopy 1 GiB -> 1 GiB: {result.tb_per_s:.2f} TB/s (read + written), {result.timing}, "
              f"{status}, clocks {result.timing.clocks}")
        if not result.correct:
            return cli.EXIT_FAILED
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
