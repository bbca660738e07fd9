"""The ElasticJob operator (kopf): one master pod per job, relaunched when it dies."""
