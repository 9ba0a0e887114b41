"""Reaper, sweeper and liveness ticks at 10,000 runs in flight: one Redis against a Redis Cluster, side by side.

`python -m bench.cluster_ticks --plain redis://… --cluster redis+cluster://… --db mysql+pymysql://…/DB
[--repeat 2] [--out docs/cluster-ticks-DATE.json]`. Each measurement is bench.growth's (15 ticks, medians:
wall ms, Redis commands counted on the server, Redis round trips of this process, SQL statements), in a
fresh subprocess per store so nothing is shared between them; the stores alternate (plain, cluster, plain,
…) so machine noise falls on both. The lease index is sharded on both (keys.LEASE_INDEX_SHARDS), so this
measures what a cluster costs over one Redis for the same code, not the sharding itself.
WARNING: flushes both Redis deployments and deletes the database's `growth` rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SIZES = (10_000,)


def _one(redis_url: str, broker_url: str, db_url: str, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Measure in a subprocess with fenced pointed at `redis_url`."""
    env = {**os.environ, "FENCED_REDIS_URL": redis_url, "FENCED_BROKER_URL": broker_url, "FENCED_DB_URL": db_url,
           "FENCED_FAST_TAKEOVER": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    code = ("import json, sys; from checkpoints.db import migrate; migrate(); from bench import growth; "
            f"print('RESULT ' + json.dumps(growth.measure({sizes!r})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--plain", required=True, help="a plain redis:// URL (also the broker of both)")
    p.add_argument("--cluster", required=True, help="a redis+cluster:// URL")
    p.add_argument("--db", required=True, help="the run store (MariaDB) URL")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    sizes = tuple(int(n) for n in args.sizes.split(","))
    out: dict[str, Any] = {"date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "sizes": sizes,
                           "command": " ".join(["python -m bench.cluster_ticks", *(argv or sys.argv[1:])]),
                           "plain": [], "cluster": []}
    for i in range(args.repeat):
        for name, url in (("plain", args.plain), ("cluster", args.cluster)):
            print(f"[{i + 1}/{args.repeat}] {name}: {url}", file=sys.stderr)
            out[name].append(_one(url, args.plain, args.db, sizes))
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
