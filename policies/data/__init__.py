"""Package data of the pure core (the MIG catalog); read only through :mod:`policies.sources`."""
