"""fedcare: personalized, privacy-preserving federated learning on healthcare data."""

# Before anything imports torch: waiting OpenMP threads sleep instead of spinning, unless the
# user chose a policy (fedcare.threads says why).
from fedcare.threads import set_passive_wait_policy as _set_passive_wait_policy

_set_passive_wait_policy()

__version__ = "0.2.0"
