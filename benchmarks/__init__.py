"""Benchmarks of tiercache against local files, boto3 and fsspec's simplecache."""
