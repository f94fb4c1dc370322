"""Tenants' commands: `tenants` (list), `tenant weight`, `tenant limits`, `tenant rule`
(docs/fairness.md)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import click

from ._base import Config, _json, _stdout, cli
from ._tables import Cell, Listing


@cli.command("tenants")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="At most this many.",
)
@click.option("--after", metavar="TENANT", help="Start after this tenant (the next page).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_obj
def tenants_command(config: Config, limit: int, after: str | None, as_json: bool) -> int:
    """List tenants by name (the default one, '', first): weight, claimable groups, groups,
    leases in flight (of the cap), messages (of the bound), rate limit and group bound."""
    with config.transport() as queue:
        tenants = queue.tenants(limit=limit, after=after)
    if as_json:
        for tenant in tenants:
            click.echo(_json(dataclasses.asdict(tenant)))
        return 0
    columns = (
        "tenant",
        "weight",
        "claimable",
        "groups",
        "in flight",
        "depth",
        "rate",
        "group bound",
    )
    table = Listing(
        *((c, Cell.KEEP, "left" if c in ("tenant", "rate") else "right") for c in columns)
    )
    for t in tenants:
        rate = "-"
        if t.rate is not None:
            rate = f"{t.rate:g}/s, burst {t.burst or 0:g}, {t.tokens or 0:.1f} left"
        table.add_row(
            t.name or "(default)",
            f"{t.weight:g}",
            str(t.ready),
            str(t.groups),
            _of(t.in_flight, t.max_in_flight),
            _of(t.depth, t.max_queued),
            rate,
            "-" if t.max_group_queued is None else str(t.max_group_queued),
        )
    title = f"{len(tenants)} tenants"
    if len(tenants) == limit:
        title += f" (more after: --after {tenants[-1].name!r})"
    table.print(title)
    return 0


def _of(count: int, bound: int | None) -> str:
    return str(count) if bound is None else f"{count} / {bound}"


@cli.group()
def tenant() -> None:
    """Set a tenant's weight or limits, or the rule naming new groups' tenants."""


@tenant.command()
@click.argument("name", metavar="TENANT")
@click.argument("value", metavar="WEIGHT", type=float)
@click.pass_obj
def weight(config: Config, name: str, value: float) -> int:
    """Give TENANT a share of claims proportional to WEIGHT (default 1; '' is the default
    tenant)."""
    with config.transport() as queue:
        queue.set_tenant(name, weight=value)
    _stdout().print(f"tenant {name!r}: weight {value:g}")
    return 0


def _limit(whole: bool) -> Any:
    """A click callback: a number, or 'none' (math.inf: no limit)."""

    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
        if value is None:
            return None
        if value.lower() == "none":
            return math.inf
        try:
            return int(value) if whole else float(value)
        except ValueError:
            what = "a whole number" if whole else "a number"
            raise click.BadParameter(f"{value!r} is not {what} or 'none'") from None

    return convert


@tenant.command()
@click.argument("name", metavar="TENANT")
@click.option("--rate", callback=_limit(False), help="Claims per second ('none': no limit).")
@click.option("--burst", type=float, help="Claims at once after a quiet spell (with a rate).")
@click.option(
    "--max-in-flight", callback=_limit(True), help="Groups leased at once ('none': no cap)."
)
@click.option("--max-queued", callback=_limit(True), help="Messages in all ('none': no bound).")
@click.option(
    "--max-group-queued",
    callback=_limit(True),
    help="Messages in each of its groups ('none': no bound).",
)
@click.pass_obj
def limits(
    config: Config,
    name: str,
    rate: float | None,
    burst: float | None,
    max_in_flight: float | None,
    max_queued: float | None,
    max_group_queued: float | None,
) -> int:
    """Set TENANT's limits ('' is the default tenant); those not given are kept. On a
    sharded queue, each shard enforces them on its own groups."""
    settings = {
        "rate": rate,
        "burst": burst,
        "max_in_flight": max_in_flight,
        "max_queued": max_queued,
        "max_group_queued": max_group_queued,
    }
    given = {key: value for key, value in settings.items() if value is not None}
    if not given:
        raise click.UsageError("give at least one of --rate, --burst, --max-in-flight, ...")
    with config.transport() as queue:
        queue.set_tenant(name, **given)
    shown = ", ".join(
        f"{key.replace('_', '-')} {'none' if value == math.inf else f'{value:g}'}"
        for key, value in given.items()
    )
    _stdout().print(f"tenant {name!r}: {shown}")
    return 0


@tenant.command()
@click.argument("separator", required=False)
@click.option(
    "--none", "clear", is_flag=True, help="No rule: new groups without a tenant go to ''."
)
@click.pass_obj
def rule(config: Config, separator: str | None, clear: bool) -> int:
    """New groups given no tenant belong to the part of their id before the first SEPARATOR
    (one character, e.g. ':')."""
    if clear == (separator is not None):
        raise click.UsageError("give a SEPARATOR or --none")
    with config.transport() as queue:
        queue.set_tenant_rule(None if clear else separator)
    _stdout().print("no tenant rule" if clear else f"tenant rule: the part before {separator!r}")
    return 0
