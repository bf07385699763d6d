"""`ebs-ops` settings: command-line options > EBS_OPS_* environment > TOML file > defaults.

The TOML file is ``ebs-ops.toml`` in the working directory, or the path in ``EBS_OPS_CONFIG``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


class EbsOpsConfig(BaseSettings):
    """Everything an operation needs besides its own arguments."""

    model_config = SettingsConfigDict(env_prefix="EBS_OPS_", extra="forbid")

    backend: Literal["ec2", "local"] = "local"
    # local backend
    data_dir: Path = Field(Path("data"), description="worker --data-dir holding partition-<p>/ volumes")
    snapshot_dir: Path = Field(Path("snapshots"), description="where local snapshots are kept")
    control_url: str | None = Field(None, description="worker control endpoint, http://127.0.0.1:PORT")
    worker: str = Field("", description="worker name recorded on snapshots (default: control url)")
    # ec2 backend
    region: str | None = None
    endpoint_url: str | None = Field(None, description="EC2 endpoint override (tests, VPC endpoints)")
    device: str = "/dev/sdf"
    volume_type: str = "gp3"
    kms_key_id: str | None = None
    fast_restore: bool = False
    init_rate_mibps: int | None = Field(None, ge=100, le=300, description="VolumeInitializationRate")
    max_attempts: int = Field(5, ge=1, le=20, description="botocore standard-mode total attempts per call")
    # waiting
    waiter_delay_s: float = Field(15.0, ge=1, description="poll interval of every waiter")
    step_timeout_s: float = Field(600.0, gt=0, description="timeout of each restore/move step")
    snapshot_timeout_s: float = Field(6 * 3600.0, gt=0, description="timeout of `wait` (large snapshots)")
    # hooks (argv templates with {partition}, {volume}, {instance})
    freeze_cmd: str | None = None
    thaw_cmd: str | None = None
    stop_cmd: str | None = None
    start_cmd: str | None = None
    hook_timeout_s: float = Field(60.0, gt=0)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = Path(os.environ.get("EBS_OPS_CONFIG", "ebs-ops.toml"))
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
