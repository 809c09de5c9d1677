"""The collector's one door to looptrace's core: everything it needs that the public API does
not offer, named in one place.

- its exceptions, drawn with all of looptrace's in one tree (``_errors``);
- the store it writes into and serves from (``_store``);
- the shape a decoded span takes (``_wire.DecodedSpan``), the OTLP media types and the
  compression module's optional zstd (``_otlp``);
- the command that installs its extra (``_install``);
- the settings it starts from (``_config``) and what counts as a loopback address
  (``_transport.settings``).
"""

from __future__ import annotations

from .._config import Config as Config
from .._errors import BadRequest as BadRequest
from .._errors import BodyTooLarge as BodyTooLarge
from .._errors import CannotListen as CannotListen
from .._errors import DecodeError as DecodeError
from .._errors import MissingServerExtra as MissingServerExtra
from .._errors import TooManySpans as TooManySpans
from .._install import install_hint as install_hint
from .._otlp import JSON_CONTENT_TYPE as JSON_CONTENT_TYPE
from .._otlp import PROTOBUF_CONTENT_TYPE as PROTOBUF_CONTENT_TYPE
from .._otlp import compression as compression
from .._store import Store as Store
from .._store import StoreError as StoreError
from .._store.experiments import DEFAULT_REGRESSION_THRESHOLD as DEFAULT_REGRESSION_THRESHOLD
from .._transport.settings import is_loopback as is_loopback
from .._wire import DecodedSpan as DecodedSpan
