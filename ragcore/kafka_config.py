"""Kafka client settings: typed, validated, with secrets masked, rendered to librdkafka keys.

Field names are librdkafka's with dots as underscores (`sasl_mechanism` -> `sasl.mechanism`),
the quix-streams habit; `extra` takes any other librdkafka property verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

#: What is masked wherever settings are shown: keys naming passwords, secrets, tokens,
#: credentials or keys (`ssl.key.pem`, `*.api_key`), and every SASL property but the mechanism.
_SECRET_KEY = re.compile(
    r"password|secret|token|credential|(^|[._])(api_)?key($|[._])|^sasl\.(?!mechanisms?$)",
    re.IGNORECASE,
)
MASK = "**********"


def is_secret_key(key: str) -> bool:
    """True when a setting or librdkafka property named `key` may hold a secret."""
    return bool(_SECRET_KEY.search(key))


def mask_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with the values of secret-looking keys masked."""
    return {k: MASK if is_secret_key(k) and v is not None else v for k, v in values.items()}


class KafkaSettings(BaseModel):
    """Connection and security options shared by every Kafka client ragstream creates."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "ragstream"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    extra: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Any other librdkafka property, passed verbatim (values of secret-looking keys "
            "are masked wherever settings are shown)."
        ),
    )

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # `extra` may carry secrets (sasl.oauthbearer.client.secret, ssl.key.pem...)
        for name, value in super().__repr_args__():
            yield name, mask_mapping(value) if name == "extra" else value

    def client_config(self) -> dict[str, Any]:
        """The librdkafka configuration dict (secrets revealed: never log this dict)."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
            "security.protocol": self.security_protocol,
        }
        optional: dict[str, str | SecretStr | None] = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password,
        }
        for key, value in optional.items():
            if isinstance(value, SecretStr):
                config[key] = value.get_secret_value()
            elif value is not None:
                config[key] = value
        config.update(self.extra)
        return config

    def redacted_config(self) -> dict[str, Any]:
        """`client_config()` with every secret-looking value masked: safe to log."""
        return mask_mapping(self.client_config())
