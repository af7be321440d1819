"""``tiercache metrics``: the node's counters for Prometheus (HTTP) or node_exporter (textfile)."""

from __future__ import annotations

import argparse
import sys
import threading

from tiercache.cli.common import add_tier_flags, config_from_args
from tiercache.metrics.serve import (
    MetricsError,
    exposition_text,
    node_registry,
    parse_listen,
    start_http,
    write_textfile,
)

NAME = "metrics"
HELP = "the node's counters in Prometheus format: serve /metrics, or write a textfile"
EPILOG = """\
examples:
  tiercache metrics --listen 127.0.0.1:9464          # Prometheus scrapes /metrics
  tiercache metrics --textfile /var/lib/node_exporter/textfile/tiercache.prom
  tiercache metrics --textfile /var/lib/node_exporter/textfile/tiercache.prom --interval 15
  tiercache metrics                                  # print them once

Every process that uses the local tier publishes its counters in LOCAL_DIR/metrics/ every
2 s and at exit; this command adds them up with those of the processes that have exited, so
node counters never go down. Gauges: tier usage and budget, uploads still pending and the
age of the oldest. Needs the metrics extra (pip install 'tiercache[metrics]'); never talks to
the store.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_tier_flags(parser)
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="serve /metrics over HTTP here until interrupted (any other path: 404)",
    )
    parser.add_argument(
        "--textfile", metavar="PATH", help="write the metrics to PATH (node_exporter's textfile)"
    )
    parser.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help="with --textfile: rewrite it every S seconds until interrupted (default: once)",
    )


def run(args: argparse.Namespace) -> int:
    if args.interval is not None and (args.textfile is None or args.interval <= 0):
        raise MetricsError("--interval needs --textfile and a number of seconds above 0")
    address = parse_listen(args.listen) if args.listen else None
    config = config_from_args(args)
    if address is None and args.textfile is None:
        sys.stdout.write(exposition_text(node_registry(config)))
        return 0
    stop = threading.Event()
    if address is not None:
        bound, _ = start_http(config, address)
        print(f"serving {bound.url()}", flush=True)
    if args.textfile is not None:
        registry = node_registry(config)
        write_textfile(registry, args.textfile)
        while args.interval is not None and not stop.wait(args.interval):
            write_textfile(registry, args.textfile)
    if address is not None:
        stop.wait()  # until interrupted (KeyboardInterrupt, SIGTERM)
    return 0
