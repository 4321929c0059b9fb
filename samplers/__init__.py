"""Built-in sample selectors (installed as grpo_zoo.samplers).

Importing this package registers every built-in selector.
"""

from grpo_zoo.samplers import dapo_filter, diva, uniform, vade  # noqa: F401  (registration)
