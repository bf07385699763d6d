"""Connection settings of the audit's Kafka clients: ``--kafka KEY=VALUE`` and ``--kafka-secret``.

``--kafka`` passes librdkafka settings (``security.protocol``, ``sasl.mechanism``, ``ssl.*``) to
every consumer the audit opens, on the driver and in the Spark tasks (the data source's
``kafka.*`` options). ``--kafka-secret`` names a Secrets Manager secret holding SCRAM credentials
in MSK's format, ``{"username": "...", "password": "..."}``: the audit reads it when it starts
(boto3, the region taken from the ARN) and adds ``sasl.username`` / ``sasl.password``, so the
password is never on a command line, in a job definition or in a schedule (the nightly EMR
Serverless job of ops/terraform/modules/spark_audit passes only the secret's ARN). With a secret
and no ``security.protocol``, the audit uses ``SASL_SSL`` and ``SCRAM-SHA-512`` (MSK's SCRAM
listener). Errors name the secret and what to fix, never a value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from spark_audit.exceptions import AuditError

#: The data source's option prefix for librdkafka settings (spark_audit/datasource.py).
OPTION_PREFIX = "kafka."
#: What a secret without explicit settings connects with: MSK's SCRAM listener (port 9096).
SECRET_DEFAULTS = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}
_ARN_REGION = re.compile(r"^arn:aws[a-z-]*:secretsmanager:([a-z0-9-]+):[0-9]{12}:secret:.+$")


def parse_settings(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; AuditError naming the item that is not one."""
    settings: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AuditError(f"--kafka {item!r}: expected KEY=VALUE, e.g. security.protocol=SASL_SSL")
        settings[key.strip()] = value
    return settings


def secret_region(secret_id: str) -> str | None:
    """The region of a Secrets Manager ARN; None for a name (boto3's configured region applies)."""
    match = _ARN_REGION.match(secret_id)
    return match.group(1) if match else None


def scram_credentials(secret_text: str, secret_id: str) -> dict[str, str]:
    """``sasl.username`` and ``sasl.password`` from a secret in MSK's SCRAM format."""
    try:
        doc = json.loads(secret_text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise AuditError(f"the Kafka secret {secret_id} is not a JSON object; MSK's SCRAM secrets hold "
                         '{"username": "...", "password": "..."}')
    out = {}
    for field in ("username", "password"):
        value = doc.get(field)
        if not isinstance(value, str) or not value:
            raise AuditError(f"the Kafka secret {secret_id} has no non-empty string {field!r} (keys: {sorted(doc)}); "
                             'MSK\'s SCRAM secrets hold {"username": "...", "password": "..."}')
        out[f"sasl.{field}"] = value
    return out


def read_secret(secret_id: str) -> str:
    """The secret's string value (Secrets Manager GetSecretValue; the client is built here)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client("secretsmanager", region_name=secret_region(secret_id))
    try:
        answer = client.get_secret_value(SecretId=secret_id)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise AuditError(f"cannot read the Kafka secret {secret_id}: {code}; check --kafka-secret and that "
                         "the job's role may secretsmanager:GetSecretValue it (and kms:Decrypt its key)") from exc
    except BotoCoreError as exc:
        raise AuditError(f"cannot read the Kafka secret {secret_id}: {exc}; check the AWS credentials and "
                         "region of the job") from exc
    text = answer.get("SecretString")
    if not isinstance(text, str):
        raise AuditError(f"the Kafka secret {secret_id} holds binary data; store the SCRAM credentials as a "
                         'JSON string {"username": "...", "password": "..."}')
    return text


def connection_settings(items: Iterable[str], secret_id: str | None) -> dict[str, str]:
    """librdkafka settings of ``--kafka`` items plus, with ``secret_id``, the secret's SCRAM
    credentials (and SECRET_DEFAULTS for what the items leave unset)."""
    settings = parse_settings(items)
    if secret_id:
        defaults = {k: v for k, v in SECRET_DEFAULTS.items()
                    if not (k == "sasl.mechanism" and "sasl.mechanisms" in settings)}  # librdkafka's alias
        settings = {**defaults, **settings, **scram_credentials(read_secret(secret_id), secret_id)}
    return settings


def as_options(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` as the data source's ``kafka.*`` options."""
    return {OPTION_PREFIX + key: value for key, value in settings.items()}


def from_options(options: dict[str, str]) -> dict[str, str]:
    """The librdkafka settings carried by ``kafka.*`` options."""
    return {key[len(OPTION_PREFIX):]: value for key, value in options.items() if key.startswith(OPTION_PREFIX)}
