#!/usr/bin/env bash
# Put "dist/DFlash Desktop.app" in a compressed disk image with a link to /Applications, so installing is
# dragging one icon onto the other: dist/DFlash-Desktop-<version>-macOS-<arch>.dmg. Signs the image when
# MACOS_SIGNING_IDENTITY is set (sign_app.sh has imported the certificate).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
DMG="dist/DFlash-Desktop-$VERSION-macOS-$(uname -m).dmg"
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
cp -R "dist/DFlash Desktop.app" "$staging/"
ln -s /Applications "$staging/Applications"
rm -f "$DMG"
hdiutil create -volname "DFlash Desktop" -srcfolder "$staging" -fs HFS+ -format UDZO -ov "$DMG"
if [ -n "${MACOS_SIGNING_IDENTITY:-}" ] && [ -n "${MACOS_CERTIFICATE:-}" ]; then
    codesign --force --timestamp --sign "$MACOS_SIGNING_IDENTITY" "$DMG"
fi
echo "$DMG: $(du -m "$DMG" | cut -f1) MiB"
