# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.
