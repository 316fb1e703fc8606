"""One module per dashboard, each a function that returns the dashboard's
Grafana JSON (generate.py writes it and its Perses rendering)."""
