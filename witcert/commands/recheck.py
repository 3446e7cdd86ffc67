"""``witcert recheck DIR``: recompute TV and A-1 in float64 from an audit trace.

Exit status 0 when every record passes, 1 on any violation (cert mismatch, a logit error
outside its radius, or TV above the certificate). See AUDIT.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from witcert.commands import options as opt

DESCRIPTION = """\
Recompute, in float64 and independently of the code that wrote them, every record of an
audit trace written by `witcert trace`: the true total variation between the attention over
the exact and over the stored keys, the logit errors against their radii, and the
certificate A - 1 (docs/MATH.md §1). Exit status 0 when every record passes, 1 on any
violation, 2 when the folder is not a readable trace. Format: AUDIT.md.
"""


def add_arguments(parser) -> None:
    parser.add_argument("trace_dir", metavar="DIR", help="folder written by `witcert trace`")
    parser.add_argument("--json", dest="json_out", default=None, metavar="FILE",
                        help="also write the per-record results to this JSON file (default: none)")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict line")


def _load_checks(trace_dir: str):
    """Check every record of ``trace_dir``; a folder that is not a readable trace is the
    user's input, reported as a ``UsageError``."""
    from witcert.eval.trace import check_record, read_record

    d = Path(trace_dir).expanduser()
    if not d.is_dir():
        raise opt.UsageError("DIR", f"{trace_dir}: no such folder (give the --out folder of "
                                    "`witcert trace`)")
    files = sorted(d.glob("L*_S*.safetensors"))
    if not files:
        raise opt.UsageError("DIR", f"{trace_dir}: no trace records (L*_S*.safetensors) in it "
                                    "(give the --out folder of `witcert trace`)")
    checks = []
    for f in files:
        try:
            record = read_record(f)
        except Exception as exc:  # noqa: BLE001 - unreadable input (safetensors raises its own type)
            raise opt.UsageError("DIR", f"{f}: unreadable trace record ({exc})") from None
        checks.append(check_record(*record))
    return checks


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3e}"


def main(args) -> int:
    if args.json_out:
        opt.check_output_file(args.json_out, "--json")
    checks = _load_checks(args.trace_dir)
    bad = [c for c in checks if not c.ok]
    if not args.quiet:
        print(f"{'layer':>5} {'step':>5} {'max TV':>10} {'max cert':>10} {'min cert/TV':>11} "
              f"{'max |d|/u':>9}  cert  radius  TV<=cert")
        for c in checks:
            ratios = [ce / tv for ce, tv in zip(c.cert, c.tv) if tv > 0]
            print(f"{c.layer:>5} {c.step:>5} {_fmt(max(c.tv)):>10} {_fmt(max(c.cert)):>10} "
                  f"{_fmt(min(ratios)) if ratios else '-':>11} {max(c.max_err_ratio):>9.3f}  "
                  f"{'ok' if c.cert_ok else 'FAIL':<4}  {'ok' if c.radius_ok else 'FAIL':<6}  "
                  f"{'ok' if c.sound else 'FAIL'}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([c.to_dict() for c in checks], indent=1))
    heads = sum(len(c.tv) for c in checks)
    if bad:
        print(f"recheck: {len(bad)} of {len(checks)} records VIOLATED "
              f"(cert mismatch {sum(not c.cert_ok for c in bad)}, radius "
              f"{sum(not c.radius_ok for c in bad)}, TV > cert {sum(not c.sound for c in bad)})")
        return 1
    print(f"recheck: OK, {len(checks)} records, {heads} (layer, head, step) certificates, "
          "every TV <= cert, every |d_t| <= u_t, every A-1 recomputed")
    return 0
