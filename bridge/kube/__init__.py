"""Kubernetes API access: the REST client, list/watch streams, discovery, kubeconfig, selectors and
leader election (client-go's ``rest``, ``discovery``, ``tools/clientcmd``, ``tools/leaderelection``).

Imports only the foundations (``bridge.contracts``, ``bridge.rawobject``, ``bridge.errors``,
``bridge.clock``); never the informer, delivery or service layers, never a sink.
"""
