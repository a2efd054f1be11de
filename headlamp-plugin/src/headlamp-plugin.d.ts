/// <reference types="@kinvolk/headlamp-plugin" />
