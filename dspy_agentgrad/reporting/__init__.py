"""What a run tells people: the result, report.html, progress and snapshots, MLflow tracking, cost estimates."""
