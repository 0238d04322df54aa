# Authenticode-sign files (the app's .exe before packing, the installer after) with a code-signing
# certificate from the repository secrets: WINDOWS_CERTIFICATE (base64 .pfx) and
# WINDOWS_CERTIFICATE_PASSWORD. Without them it prints a notice and signs nothing (SmartScreen will warn).
#   pwsh installers/windows/sign.ps1 dist/dflash-desktop/dflash-desktop.exe
param([Parameter(Mandatory = $true, ValueFromRemainingArguments = $true)][string[]]$Files)
$ErrorActionPreference = "Stop"
if (-not $env:WINDOWS_CERTIFICATE) {
    Write-Output "::notice::WINDOWS_CERTIFICATE not set: $($Files -join ', ') left unsigned"
    exit 0
}
$pfx = Join-Path $env:RUNNER_TEMP "certificate.pfx"
[IO.File]::WriteAllBytes($pfx, [Convert]::FromBase64String($env:WINDOWS_CERTIFICATE))
$signtool = Get-ChildItem "${env:ProgramFiles(x86)}\Windows Kits\10\bin\*\x64\signtool.exe" |
    Sort-Object FullName -Descending | Select-Object -First 1
try {
    & $signtool.FullName sign /fd sha256 /tr http://timestamp.digicert.com /td sha256 `
        /f $pfx /p $env:WINDOWS_CERTIFICATE_PASSWORD $Files
    if ($LASTEXITCODE -ne 0) { throw "signtool failed ($LASTEXITCODE)" }
    & $signtool.FullName verify /pa $Files
    if ($LASTEXITCODE -ne 0) { throw "signature check failed ($LASTEXITCODE)" }
} finally {
    Remove-Item $pfx
}
