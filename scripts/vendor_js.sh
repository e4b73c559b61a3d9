#!/usr/bin/env bash
# Copy the book's JavaScript (MathJax, RequireJS, the ipywidgets HTML manager) from
# npm into _vendor/vendor/, which _config.yml serves at <site>/vendor/ via
# html_extra_path: the built site loads no script from the network.
set -euo pipefail
cd "$(dirname "$0")/.."
npm ci --no-audit --no-fund --loglevel=error
rm -rf _vendor && mkdir -p _vendor/vendor
cp node_modules/requirejs/require.js _vendor/vendor/require.js
cp -r node_modules/@jupyter-widgets/html-manager/dist _vendor/vendor/html-manager
cp -r node_modules/mathjax/es5 _vendor/vendor/mathjax
