"""The ``muster`` command line: the typer app and where each command is registered; the commands
live one module per group beside it (``simulate``, ``run``, ``broker``, ``store``, ``audit``, ``schema``,
``devcluster``), what they share in ``options`` and ``errors``."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from shared.cli import audit, broker, run, schema, signing, simulate, store
from shared.cli.devcluster import devcluster_app
from shared.cli.errors import failed

try:  # typer 0.22 and later parse with a copy of click of their own, whose exceptions these are
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - an older typer, on click itself
    from click.exceptions import NoArgsIsHelpError, UsageError


class _OneLineUsage(TyperGroup):
    """click's usage errors (a bad flag value, a missing argument, an unknown option or command) as one
    ``error:`` line and exit code 2, like every other bad input, instead of typer's usage box; whichever
    subcommand they come from, they pass through the root group's parsing or invoking."""

    def make_context(self, *args: Any, **kwargs: Any) -> typer.Context:
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:
            raise _usage_failed(exc) from None

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise _usage_failed(exc) from None


def _usage_failed(exc: UsageError) -> Exception:
    """The one line for a usage error; a group named without a command still shows its help."""
    if isinstance(exc, NoArgsIsHelpError):
        return exc
    text = " ".join(exc.format_message().split())
    if exc.ctx is not None:
        text += f" (see {exc.ctx.command_path} --help)"
    return failed(text)


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=_OneLineUsage,
                  help="muster: an event-sourced batch scheduler for Ray workloads on Kubernetes.")
schema_app = typer.Typer(no_args_is_help=True, help="The event contract.")
app.add_typer(schema_app, name="schema")
db_app = typer.Typer(no_args_is_help=True, help="The history store's tables (Alembic migrations).")
app.add_typer(db_app, name="db")
log_app = typer.Typer(no_args_is_help=True, help="The event log as a file: taken out of a deployment, or loaded "
                      "into a store.")
app.add_typer(log_app, name="log")
app.add_typer(devcluster_app, name="devcluster")


# Registered in the order `muster --help` lists them (typer keeps it): the commands, then the groups.
app.command("simulate")(simulate.simulate_cmd)
app.command("run")(run.run_cmd)
app.command("broker")(broker.broker_cmd)
app.command("history")(store.history_cmd)
app.command("queues")(store.queues_cmd)
db_app.command("upgrade")(store.db_upgrade)
db_app.command("downgrade")(store.db_downgrade)
log_app.command("export")(audit.log_export)
log_app.command("import")(audit.log_import)
log_app.command("archive")(audit.log_archive)
log_app.command("key")(signing.log_key)
log_app.command("keygen")(signing.log_keygen)
log_app.command("checkpoints")(signing.log_checkpoints)
app.command("replay")(audit.replay_cmd)
app.command("explain")(audit.explain_cmd)
app.command("report")(audit.report_cmd)
schema_app.command("export")(schema.schema_export)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":
    main()
