# Install DFlash Desktop as a user does, silently (per user, no administrator), run the installed copy
# (version, then the self-test: window, demo pair, one prompt through its own worker), then uninstall it
# silently and check that program, shortcuts and Apps entry are gone and the user's data is kept.
#   pwsh installers/windows/test_installed.ps1 dist/DFlash-Desktop-0.1.0-Setup.exe
param([Parameter(Mandatory = $true)][string]$Setup)
$ErrorActionPreference = "Stop"
$app = Join-Path $env:LOCALAPPDATA "Programs\DFlash Desktop"
$exe = Join-Path $app "dflash-desktop.exe"
$key = "HKCU:\Software\Microsoft\Windows\CurrentVersion\Uninstall\DFlashDesktop"
$shortcuts = @((Join-Path ([Environment]::GetFolderPath("Programs")) "DFlash Desktop.lnk"),
               (Join-Path ([Environment]::GetFolderPath("Desktop")) "DFlash Desktop.lnk"))

function Run-App([string[]]$Arguments, [int]$TimeoutS) {
    # a windowed program: Start-Process waits for it and gives its output through files
    $out = New-TemporaryFile; $err = New-TemporaryFile
    $p = Start-Process -FilePath $exe -ArgumentList $Arguments -PassThru -NoNewWindow `
        -RedirectStandardOutput $out -RedirectStandardError $err
    if (-not $p.WaitForExit($TimeoutS * 1000)) { $p.Kill(); throw "$Arguments did not finish in $TimeoutS s" }
    Get-Content $out, $err
    if ($p.ExitCode -ne 0) { throw "dflash-desktop $Arguments exited with $($p.ExitCode)" }
}

$p = Start-Process -FilePath $Setup -ArgumentList "/S" -Wait -PassThru
if ($p.ExitCode -ne 0) { throw "the installer exited with $($p.ExitCode)" }
if (-not (Test-Path $exe)) { throw "not installed: $exe" }
foreach ($s in $shortcuts) { if (-not (Test-Path $s)) { throw "missing shortcut $s" } }
Write-Output "installed version $((Get-ItemProperty $key).DisplayVersion) in $app"

Run-App @("--version") 60
Run-App @("--self-test", "--timeout", "900") 960
# the torch engine too (the plan picks llama.cpp on a CPU): an import only Windows breaks shows here
Run-App @("--self-test", "--timeout", "900", "--engine", "torch") 960

$p = Start-Process -FilePath (Join-Path $app "uninstall.exe") -ArgumentList "/S" -Wait -PassThru
if ($p.ExitCode -ne 0) { throw "the uninstaller exited with $($p.ExitCode)" }
# the uninstaller copies itself to %TEMP% and runs from there: wait for the folder to go
for ($i = 0; $i -lt 120 -and (Test-Path $app); $i++) { Start-Sleep -Seconds 1 }
if (Test-Path $app) { throw "uninstall left $app" }
foreach ($s in $shortcuts) { if (Test-Path $s) { throw "uninstall left $s" } }
if (Test-Path $key) { throw "uninstall left the Apps entry" }
Write-Output "installed, ran and uninstalled $Setup"
