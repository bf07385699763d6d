"""Kafka SCRAM credentials (JSON on stdin) -> the worker's TOML ``[kafka]`` table (stdout).

Run on a worker instance at every boot by dedupe-scram.service (the user data of
ops/terraform/modules/dedupe_workers installs it): stdin is the secret's value, MSK's SCRAM secret
format ``{"username": "...", "password": "..."}``; argv[1] is the ``sasl.mechanism``. The output is
the file ``dedupe-worker run --config`` reads (docs/WORKER.md, ``[kafka]``). On bad input it exits 1
with a message naming what is wrong and never the value. Python 3.9+ standard library only (the
instance's system Python, not the image's).
"""

import json
import sys

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string: quote, backslash and the control characters TOML forbids
    literally (all but tab) are escaped; everything else, non-ASCII included, is kept as is."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\t" or (ord(ch) >= 0x20 and ord(ch) != 0x7F):
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04X}")
    return '"' + "".join(out) + '"'


def field(doc: dict, name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"the secret has no non-empty string {name!r} (keys: {sorted(doc)}); MSK's SCRAM "
                         'secrets hold {"username": "...", "password": "..."}')
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the secret's {name!r} holds an unpaired surrogate (\\ud800-\\udfff): not text") from None
    return value


def render(secret_text: str, mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ValueError(f"sasl.mechanism {mechanism!r} is not one of {', '.join(MECHANISMS)}")
    try:
        doc = json.loads(secret_text)
    except ValueError:
        raise ValueError("the secret is not JSON; MSK's SCRAM secrets hold "
                         '{"username": "...", "password": "..."}') from None
    if not isinstance(doc, dict):
        raise ValueError(f"the secret is a JSON {type(doc).__name__}, not an object with username and password")
    lines = ["[kafka]", '"security.protocol" = "SASL_SSL"', f'"sasl.mechanism" = {toml_string(mechanism)}',
             f'"sasl.username" = {toml_string(field(doc, "username"))}',
             f'"sasl.password" = {toml_string(field(doc, "password"))}']
    return "\n".join(lines) + "\n"


def main(argv: list) -> int:
    if len(argv) != 2:
        print("usage: scram_toml.py SASL_MECHANISM < secret.json > worker.toml", file=sys.stderr)
        return 2
    try:
        text = render(sys.stdin.read(), argv[1])
    except ValueError as exc:
        print(f"dedupe-scram: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
