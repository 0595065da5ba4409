"""PySpark checks of chaos-run histories: ``python -m spark_analysis RUN_DIR [--out DIR]``."""
