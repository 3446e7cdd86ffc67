"""witcert: certified KV-cache compression.

Importing this package has no side effects: nothing is registered with transformers,
vLLM or any other host until you call the explicit ``register_*`` functions.
"""

from witcert.config import CacheConfig, CertConfig, QuantConfig, RepairPolicy

__all__ = ["CacheConfig", "CertConfig", "QuantConfig", "RepairPolicy"]
__version__ = "0.1.0"
