"""`simrun ui` opens the web view logged in; `simrun web` serves the view alone, as a client of a gateway."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import click
from simrun_core.errors import InvalidArgument, Unauthenticated, Unavailable

from simrun_cli.options import endpoint_option, tls_ca_option, token_option

WEB_URL_FILE = "web-url"
"""Where `simrun server` writes its web view's address in the home (`simrun_cli.server` writes it)."""


def web_url(given: str | None) -> str:
    """The web view's address: given, else the one `simrun server` wrote in the home, else the default."""
    from simrun_core.config import DEFAULT_WEB_ADDRESS
    from simrun_core.home import simrun_home

    if given:
        return given.rstrip("/") if "://" in given else f"http://{given}"
    written = simrun_home() / WEB_URL_FILE
    if written.is_file():
        return written.read_text().strip().rstrip("/")
    return f"http://{DEFAULT_WEB_ADDRESS}"


def login_link(url: str, token: str, tls_ca: Path | None = None) -> str:
    """A one-time login link of the web view at `url` for `token` (the token goes in a header, never a URL).

    Raises:
        Unavailable: nothing answers at `url`.
        Unauthenticated: the view refused the token.
    """
    request = urllib.request.Request(
        f"{url}/login/links", method="POST", data=b"", headers={"Authorization": f"Bearer {token}"}
    )
    context = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca and url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            path = json.load(response)["path"]
    except urllib.error.HTTPError as exc:
        try:
            reason = json.load(exc).get("error", "")
        except (ValueError, AttributeError):
            reason = ""
        error = Unauthenticated if exc.code == 401 else Unavailable
        raise error(f"the web view at {url} refused to log in: {reason or exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unavailable(
            f"cannot reach the web view at {url} ({reason}): is `simrun server` running, with its web view on?"
        ) from None
    return f"{url}{path}"


@click.command()
@click.option("--web", "url", metavar="URL", help="The web view; default: the one `simrun server` serves here.")
@token_option
@tls_ca_option
@click.option("--no-browser", is_flag=True, help="Print the one-time login link instead of opening a browser.")
def ui(url: str | None, token: str | None, tls_ca: Path | None, no_browser: bool) -> None:
    """Open the web view in a browser, logged in by a one-time link (it works once, for two minutes)."""
    import webbrowser

    from simrun_core.home import client_token

    secret = client_token(token)
    if not secret:
        raise Unauthenticated("no token: give --token or SIMRUN_TOKEN, or run this where `simrun server` wrote one")
    link = login_link(web_url(url), secret, tls_ca)
    if no_browser or not webbrowser.open(link):
        click.echo(f"open this link to log in (it works once, for two minutes):\n{link}")
    else:
        click.echo("opened the web view in your browser")


@click.command()
@endpoint_option
@tls_ca_option
@click.option("--address", default=None, metavar="HOST:PORT", help="Where to listen; default 127.0.0.1:50552.")
@click.option("--insecure", is_flag=True, help="Serve plaintext beyond loopback (session cookies in the clear).")
def web(endpoint: str, tls_ca: Path | None, address: str | None, insecure: bool) -> None:
    """Serve the web view alone, as a client of the simrun at --endpoint, until Ctrl-C."""
    from simrun_core.config import DEFAULT_WEB_ADDRESS, is_loopback
    from simrun_web.app import WebConfig
    from simrun_web.serve import WebServer

    address = address or DEFAULT_WEB_ADDRESS
    if not is_loopback(address) and not insecure:
        raise InvalidArgument(
            f"--address {address}: beyond loopback put the view behind TLS, or give --insecure to serve it in the clear"
        )
    server = WebServer(address)
    click.echo(f"the web view of {endpoint} is at {server.url}: `simrun ui --web {server.url}` opens it logged in")
    server.run(WebConfig(endpoint, tls_ca=tls_ca))
