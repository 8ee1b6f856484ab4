"""The one matcher: pairing checkpoint variables with each other (``diff``) or with a model's
(``transplant``, ``doctor``, ``extract --builder``), ``--map`` rules and layout fits."""
