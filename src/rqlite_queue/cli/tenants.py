"""Tenants' commands: `tenants` (list), `tenant weight`, `tenant rule` (docs/fairness.md)."""

from __future__ import annotations

import dataclasses

import click
from rich.table import Table

from ._base import Config, _json, _stdout, cli


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
    leases in flight, messages."""
    with config.transport() as queue:
        tenants = queue.tenants(limit=limit, after=after)
    if as_json:
        for tenant in tenants:
            click.echo(_json(dataclasses.asdict(tenant)))
        return 0
    table = Table()
    for column in ("tenant", "weight", "claimable", "groups", "in flight", "depth"):
        table.add_column(column, justify="left" if column == "tenant" else "right")
    for t in tenants:
        table.add_row(
            t.name or "(default)",
            f"{t.weight:g}",
            str(t.ready),
            str(t.groups),
            str(t.in_flight),
            str(t.depth),
        )
    title = f"{len(tenants)} tenants"
    if len(tenants) == limit:
        title += f" (more after: --after {tenants[-1].name!r})"
    _stdout().print(title, table, sep="\n")
    return 0


@cli.group()
def tenant() -> None:
    """Set a tenant's weight, or the rule naming new groups' tenants."""


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
