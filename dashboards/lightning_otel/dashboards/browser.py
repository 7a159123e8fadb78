"""Headless Debian Chromium for the dashboard's browser tests and screenshots (Playwright drives it;
no browser is ever downloaded)."""

CHROMIUM = "/usr/bin/chromium"  # Debian's package `chromium` (`make test` installs it)
# Without the background-networking flags Chromium keeps trying (and failing) to reach Google's hosts
# from a machine with no internet; --no-sandbox because CI runs as root.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
